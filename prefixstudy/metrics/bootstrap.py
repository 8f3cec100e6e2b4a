"""Resampling that respects how the data were made: requests (and engine steps) in a point are a
time series, and points are repeated runs.

Consecutive requests' latencies correlate strongly under load (0.97-1.00 at the H200 knee), so
resampling requests one by one makes intervals several times too narrow.  A *moving block*
bootstrap resamples runs of consecutive items instead.  Repeats are resampled too (a
*hierarchical* bootstrap: repeats with replacement, then blocks inside each), so the spread
between runs is inside every interval.  ON and OFF are resampled *paired*: the same blocks of
request indices in both modes, since both saw the same arrival schedule.

Everything takes an explicit seed; nothing touches global random state.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

N_BOOT = 400
CI = 0.95


def block_length(n: int) -> int:
    """sqrt(n), at least 1: long enough to keep the correlation of a point's queue build-up,
    short enough that a 40-request point still has ~6 blocks to shuffle."""
    return max(1, int(round(math.sqrt(n))))


def block_indices(n: int, rng: np.random.Generator, block: int | None = None) -> np.ndarray:
    """Indices of one moving-block resample of a series of length ``n`` (circular, length n)."""
    if n <= 0:
        return np.zeros(0, dtype=int)
    b = block or block_length(n)
    starts = rng.integers(0, n, size=math.ceil(n / b))
    return ((starts[:, None] + np.arange(b)[None, :]) % n).ravel()[:n]


def hierarchical(runs: Sequence[np.ndarray], stat: Callable[[np.ndarray], np.ndarray], *,
                 n_boot: int = N_BOOT, seed=0) -> np.ndarray:
    """``stat`` of ``n_boot`` resamples of the stacked rows of ``runs`` (one 2-D array per repeat,
    rows in time order): repeats with replacement, then moving blocks of rows inside each.
    Returns an array (n_boot, ...) of the statistic."""
    runs = [np.asarray(r, dtype=float) for r in runs if len(r)]
    if not runs:
        return np.full((0,), math.nan)
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n_boot):
        picked = rng.integers(0, len(runs), size=len(runs)) if len(runs) > 1 else [0]
        rows = np.concatenate([runs[i][block_indices(len(runs[i]), rng)] for i in picked])
        out.append(stat(rows))
    return np.asarray(out)


def interval(replicates: np.ndarray, ci: float = CI) -> tuple[float, float]:
    """The percentile interval of finite replicates ((nan, nan) for none)."""
    r = np.asarray(replicates, dtype=float)
    r = r[np.isfinite(r)]
    if not r.size:
        return (math.nan, math.nan)
    lo, hi = np.quantile(r, [(1 - ci) / 2, 1 - (1 - ci) / 2])
    return (float(lo), float(hi))


def rate_seed(rate: float) -> int:
    """A seed from a rate (req/s, to 1e-3); ``inf`` (everything at once) gets its own."""
    return int(round(float(rate) * 1000)) if math.isfinite(rate) else 2**31 - 1


def gain(on: float, off: float) -> float:
    """(OFF - ON) / OFF: 0.3 means ON is 30 % faster."""
    return (off - on) / off if off and math.isfinite(off) and math.isfinite(on) else math.nan
