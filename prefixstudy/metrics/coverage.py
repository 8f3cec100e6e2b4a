"""Synthetic studies with a known answer, to measure how often an interval method covers it.

A study here is R repeats of one point on one machine.  Each repeat has its own run effect
(``run_sd_ms``: what moves between runs, such as where the engine's batches happened to fall) and
``n`` consecutive request latencies around it with AR(1) correlation ``rho`` (queueing makes
neighbours alike).  The true answer is the machine's mean ``MEAN_MS``, what infinitely many
repeats would average to.  Used by tests/unit/metrics/test_coverage.py and
benchmarks/interval_coverage.py.
"""

from __future__ import annotations

import numpy as np

from prefixstudy.shared.bootstrap import N_BOOT, hierarchical, interval, over_repeats

MEAN_MS = 800.0


def study(rng: np.random.Generator, repeats: int, n: int = 40, run_sd_ms: float = 20.0, within_sd_ms: float = 30.0,
          rho: float = 0.9) -> list[np.ndarray]:
    """One synthetic study: ``repeats`` arrays of shape (n, 1) of latencies in ms."""
    runs = []
    for _ in range(repeats):
        e = np.empty(n)
        e[0] = rng.normal(0.0, within_sd_ms)
        shocks = rng.normal(0.0, within_sd_ms * np.sqrt(1 - rho ** 2), n)
        for i in range(1, n):
            e[i] = rho * e[i - 1] + shocks[i]
        runs.append((MEAN_MS + rng.normal(0.0, run_sd_ms) + e)[:, None])
    return runs


def _mean(r: np.ndarray) -> np.ndarray:
    return np.array([r[:, 0].mean()])


def coverage(repeats: int, n_studies: int, seed: int, method: str = "over_repeats",
             n_boot: int = N_BOOT, **shape) -> float:
    """Share of ``n_studies`` synthetic studies whose 95 % interval of the mean holds ``MEAN_MS``.
    ``method``: "over_repeats" (``shared.bootstrap.over_repeats``) or "percentile" (the
    hierarchical percentile bootstrap: repeats with replacement, then blocks)."""
    rng = np.random.default_rng(seed)
    hits = 0
    for _ in range(n_studies):
        runs = study(rng, repeats, **shape)
        if method == "over_repeats":
            _, lo, hi = over_repeats(runs, _mean, n_boot=n_boot, seed=rng)
            lo, hi = float(lo[0]), float(hi[0])
        elif method == "percentile":
            lo, hi = interval(hierarchical(runs, lambda r: r[:, 0].mean(), n_boot=n_boot, seed=rng))
        else:
            raise ValueError(f"method {method!r}: over_repeats or percentile")
        hits += lo <= MEAN_MS <= hi
    return hits / n_studies
