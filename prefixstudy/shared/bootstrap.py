"""Resampling that respects how the data were made: requests (and engine steps) in a point are a
time series, and points are repeated runs.

Consecutive requests' latencies correlate strongly under load (0.97-1.00 at the H200 knee), so
resampling requests one by one makes intervals several times too narrow.  A *moving block*
bootstrap resamples runs of consecutive items instead.  ON and OFF are resampled *paired*: the same
blocks of request indices in both modes, since both saw the same arrival schedule.

Between repeats (``over_repeats``), resampling 2-3 repeats with replacement cannot show how far
apart runs fall: its percentile interval was 0.35-0.78x the width of a t-interval over the repeat
means, and a repeat's own mean fell outside its rate's interval.  With two or more repeats the
interval is Student's t over the repeats' statistics, ``estimate +- t(R-1) * sd / sqrt(R)``: each
repeat's statistic already carries its within-run noise, so the one spread between them covers
both, and the t quantile pays for estimating it from R values (tested by simulation:
tests/unit/metrics/test_coverage.py, benchmarks/interval_coverage.py).  One repeat says nothing
about run-to-run spread: its interval is the within-run moving-block bootstrap alone.  Either way
an interval holds for the machine it ran on: another machine of the same kind is another run
effect, not inside it.

Everything takes an explicit seed; nothing touches global random state.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

N_BOOT = 1000
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


@dataclass(frozen=True)
class Stat:
    """A statistic with its vectorized twin: ``one`` maps rows (n, k) to the statistic, ``many``
    maps resamples (B, n, k) to B of them, the same values as ``one`` on each.  ``hierarchical``
    uses ``many`` for the one-run case, where every resample has n rows: one call, not n_boot."""

    one: Callable[[np.ndarray], np.ndarray]
    many: Callable[[np.ndarray], np.ndarray]

    def __call__(self, rows: np.ndarray) -> np.ndarray:
        return self.one(rows)


def hierarchical(runs: Sequence[np.ndarray], stat: Callable[[np.ndarray], np.ndarray], *,
                 n_boot: int = N_BOOT, seed=0) -> np.ndarray:
    """``stat`` of ``n_boot`` resamples of the stacked rows of ``runs`` (one 2-D array per repeat,
    rows in time order): repeats with replacement, then moving blocks of rows inside each.
    Returns an array (n_boot, ...) of the statistic."""
    runs = [np.asarray(r, dtype=float) for r in runs if len(r)]
    if not runs:
        return np.full((0,), math.nan)
    rng = np.random.default_rng(seed)
    if len(runs) == 1 and isinstance(stat, Stat):  # the same draws as the loop below, in one array
        idx = np.stack([block_indices(len(runs[0]), rng) for _ in range(n_boot)])
        return np.asarray(stat.many(runs[0][idx]))
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


@functools.lru_cache(maxsize=256)
def t_quantile(p: float, df: int) -> float:
    """Student's t quantile (0.5 < p < 1), numpy only: Simpson's rule on the density in
    u = atan(t / sqrt(df)) (bounded on [0, pi/2), heavy tails included), then bisection.
    Cached: 12 ms a call, and every interval over repeats asks for the same few."""
    if not 0.5 < p < 1 or df < 1:
        raise ValueError(f"t_quantile({p}, {df}): need 0.5 < p < 1 and df >= 1")
    # With t = sqrt(df) tan(u), the density dt becomes c * cos(u)^(df - 1) du.
    c = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(math.pi)

    def cdf_from_zero(t: float) -> float:
        u = np.linspace(0.0, math.atan(t / math.sqrt(df)), 2001)
        f = np.cos(u) ** (df - 1)
        h = u[1] - u[0]
        return float(c * h / 3 * (f[0] + f[-1] + 4 * f[1:-1:2].sum() + 2 * f[2:-1:2].sum()))

    lo, hi = 0.0, 1.0
    while cdf_from_zero(hi) < p - 0.5:
        hi *= 2
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf_from_zero(mid) < p - 0.5 else (lo, mid)
    return (lo + hi) / 2


def over_repeats(runs: Sequence[np.ndarray], stat: Callable[[np.ndarray], np.ndarray], *,
                 n_boot: int = N_BOOT, seed=0, ci: float = CI,
                 bounds: tuple[float, float] = (-math.inf, math.inf)) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(estimate, lo, hi) of ``stat`` over ``runs`` (one 2-D array per repeat, rows in time order),
    each an array of ``stat``'s shape.  The estimate is ``stat`` of all rows pooled; the interval is
    Student's t over the repeats' own statistics with two or more repeats, the percentile interval
    of a moving-block bootstrap of the one run otherwise (see the module docstring).  ``bounds``:
    the values the statistic can take (a latency is >= 0, a gain <= 1); a t interval over two or
    three widely spread repeats can reach past them, and is cut there."""
    runs = [np.asarray(r, dtype=float) for r in runs if len(r)]
    if not runs:
        return (np.full(1, math.nan),) * 3
    est = np.atleast_1d(np.asarray(stat(np.concatenate(runs)), dtype=float))
    if len(runs) == 1:
        reps = np.asarray(hierarchical(runs, stat, n_boot=n_boot, seed=seed), dtype=float).reshape(n_boot, -1)
        lo, hi = np.array([interval(reps[:, j], ci) for j in range(reps.shape[1])]).T
        return est, lo, hi
    per = np.array([np.atleast_1d(np.asarray(stat(r), dtype=float)) for r in runs])
    half = t_quantile(1 - (1 - ci) / 2, len(runs) - 1) * per.std(axis=0, ddof=1) / math.sqrt(len(runs))
    return est, np.maximum(est - half, bounds[0]), np.minimum(est + half, bounds[1])
