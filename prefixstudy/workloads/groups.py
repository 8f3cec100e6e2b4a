"""Workload ``groups``: many shared prefixes (system prompts, documents) with a popularity and an order.

Group g has a prefix of its own; each request is its group's prefix + a unique suffix.  Group
popularity is uniform or Zipf (weight of group g ∝ (g + 1)^-exponent); the order is
``round_robin`` (smooth weighted round robin: deterministic, each group's share follows its
popularity, uniform popularity gives 0, 1, ..., G-1, 0, ...), ``random`` (independent draws) or
``bursty`` (runs of one group, run length geometric with mean ``burst_mean``, each run's group
drawn by popularity).  Prefix lengths are drawn once per group, suffix and output lengths per
request.  Each row records its group; the runner records what its prefix lets a cache serve.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from prefixstudy.errors import UserError
from prefixstudy.workloads.base import DatasetRow, synthetic_count, token_high
from prefixstudy.config.workload_specs import MixConfig
from prefixstudy.workloads.lengths import Length, draw, lowest

if TYPE_CHECKING:
    from prefixstudy.config import StudyConfig


def rows(cfg: "StudyConfig", vocab: int) -> tuple[list[DatasetRow], str]:
    d = cfg.dataset
    mix = d.mix or MixConfig()
    n = synthetic_count(cfg)
    high = token_high(d, vocab)
    lens = (mix.prefix_len if mix.prefix_len is not None else d.prefix_len,
            mix.suffix_len if mix.suffix_len is not None else d.suffix_len,
            mix.output_len if mix.output_len is not None else d.output_len)
    if lowest(lens[2]) < 1:
        raise UserError("field 'dataset.mix.output_len': lengths must be >= 1")
    if lowest(lens[0]) + lowest(lens[1]) < 1:
        raise UserError("field 'dataset.mix': prefix_len + suffix_len can be 0; make one of them >= 1")
    return make_groups(n, d.groups, mix, lens, d.seed, d.token_low, high), "dataset (groups)"


def popularity(groups: int, mix: MixConfig) -> np.ndarray:
    w = np.ones(groups) if mix.popularity == "uniform" else (np.arange(groups) + 1.0) ** -mix.zipf_exponent
    return w / w.sum()


def group_order(n: int, weights: np.ndarray, mix: MixConfig, rng: np.random.Generator) -> np.ndarray:
    """The group of each of n requests."""
    if mix.order == "random":
        return rng.choice(len(weights), size=n, p=weights)
    if mix.order == "bursty":
        out: list[int] = []
        while len(out) < n:
            out += [int(rng.choice(len(weights), p=weights))] * int(rng.geometric(1.0 / mix.burst_mean))
        return np.asarray(out[:n])
    current, out = np.zeros(len(weights)), np.empty(n, dtype=np.int64)
    for i in range(n):  # smooth weighted round robin (nginx's): ties go to the lower group
        current += weights
        g = int(np.argmax(np.round(current, 9)))  # rounded: 1/3 + 1/3 + 1/3 must tie with 1
        current[g] -= 1.0
        out[i] = g
    return out


def make_groups(n: int, groups: int, mix: MixConfig, lens: tuple[Length, Length, Length], seed: int = 0,
                token_low: int = 100, token_high: int = 32768) -> list[DatasetRow]:
    rng = np.random.default_rng(seed)
    prefix_lens = draw(lens[0], rng, groups)
    prefixes = [rng.integers(token_low, token_high, size=int(p)) for p in prefix_lens]
    order = group_order(n, popularity(groups, mix), mix, rng)
    suffix_lens, output_lens = draw(lens[1], rng, n), np.maximum(draw(lens[2], rng, n), 1)
    out = []
    for i, g in enumerate(order):
        s = max(int(suffix_lens[i]), 1 if prefix_lens[g] == 0 else 0)  # never an empty prompt
        ids = np.concatenate([prefixes[g], rng.integers(token_low, token_high, size=s)]).tolist()
        out.append(DatasetRow(f"g{i:06d}", ids, int(output_lens[i]), int(g)))
    return out
