"""Workload ``fixed``: the seed's fixed-prompt shape, composed at token level.

A prompt is a shared prefix of its group (P tokens) plus a unique suffix (S tokens); prompts are
never built by joining text, so the shared prefix is exact at token level.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from prefixstudy.errors import UserError
from prefixstudy.workloads.base import DatasetRow, synthetic_count, token_high

if TYPE_CHECKING:
    from prefixstudy.config import StudyConfig


def rows(cfg: "StudyConfig", vocab: int) -> tuple[list[DatasetRow], str]:
    """The configured fixed-prompt dataset; as many requests as the largest point needs by default."""
    d = cfg.dataset
    n = synthetic_count(cfg)
    high = token_high(d, vocab)
    return make_dataset(n, d.prefix_len, d.suffix_len, d.output_len, d.groups, d.seed, d.token_low, high), \
        "dataset (generated)"


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
