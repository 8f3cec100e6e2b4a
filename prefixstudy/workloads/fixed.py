"""Workload ``fixed``: the seed's fixed-prompt shape, composed at token level.

A prompt is a shared prefix of its group (P tokens) plus a unique suffix (S tokens); prompts are
never built by joining text, so the shared prefix is exact at token level.

With ``dataset.shared_fraction`` f the prompt length L = P + S stays fixed and only the split moves:
``shared_split`` gives floor(f·L) shared tokens (f read as the decimal it is written as, so 0.29 of
100 is 29, not 28) and the rest unique.  A prefix cache serves whole blocks and never a prompt's last
token, so once the prefix is cached each request hits floor(min(shared, L - 1) / B)·B tokens of
its L, block size B: ``expected_hit_rate``.  The runner primes every group's prefix
(``sweep.prime_prefixes``, on by default) before a point's measured requests, so that is every
measured request's hit rate and the point's.
"""

from __future__ import annotations

from fractions import Fraction
from typing import TYPE_CHECKING

import numpy as np

from prefixstudy.errors import UserError
from prefixstudy.workloads.base import DatasetRow, block_floor, synthetic_count, token_high

if TYPE_CHECKING:
    from prefixstudy.config import StudyConfig


def rows(cfg: "StudyConfig", vocab: int) -> tuple[list[DatasetRow], str]:
    """The configured fixed-prompt dataset; as many requests as the largest point needs by default."""
    d = cfg.dataset
    n = synthetic_count(cfg)
    high = token_high(d, vocab)
    prefix_len, suffix_len = d.prefix_len, d.suffix_len
    if d.shared_fraction is not None:
        prefix_len, suffix_len = shared_split(prefix_len + suffix_len, d.shared_fraction)
    return make_dataset(n, prefix_len, suffix_len, d.output_len, d.groups, d.seed, d.token_low, high), \
        "dataset (generated)"


def shared_split(prompt_len: int, fraction: float) -> tuple[int, int]:
    """(shared, unique) tokens of a ``prompt_len``-token prompt whose ``fraction`` is shared:
    floor(fraction x prompt_len), the fraction taken as the decimal it prints as."""
    if not 0 <= fraction <= 1:
        raise UserError(f"field 'dataset.shared_fraction': {fraction} is not in [0, 1]")
    shared = int(Fraction(str(float(fraction))) * prompt_len)
    return shared, prompt_len - shared


def expected_hit_rate(prompt_len: int, shared: int, block: int) -> float:
    """The share of a prompt a warm prefix cache serves: whole blocks of the shared prefix, never
    the prompt's last token, floor(min(shared, prompt_len - 1) / block)·block / prompt_len."""
    return block_floor(min(shared, prompt_len - 1), block) / prompt_len


def make_dataset(
    num_requests: int,
    prefix_len: int = 1198,
    suffix_len: int = 16,
    output_len: int = 143,
    groups: int = 1,
    seed: int = 0,
    token_low: int = 100,
    token_high: int = 32768,
) -> list[DatasetRow]:
    """Request i belongs to group i % groups and gets that group's prefix plus its own suffix."""
    if num_requests <= 0 or groups <= 0 or output_len <= 0:
        raise UserError("dataset: num_requests, groups and output_len must be > 0")
    if prefix_len < 0 or suffix_len < 0 or prefix_len + suffix_len == 0:
        raise UserError("dataset: prefix_len and suffix_len must be >= 0 and not both 0")
    if not 0 <= token_low < token_high:
        raise UserError(f"dataset: token range [{token_low}, {token_high}) is empty")
    rng = np.random.default_rng(seed)
    prefixes = rng.integers(token_low, token_high, size=(groups, prefix_len))
    suffixes = rng.integers(token_low, token_high, size=(num_requests, suffix_len))
    rows = []
    for i in range(num_requests):
        g = i % groups
        ids = np.concatenate([prefixes[g], suffixes[i]]).tolist()
        rows.append(DatasetRow(f"r{i:06d}", ids, output_len, g))
    return rows
