"""The engine's step cost, and from it the engine-level prefill share and the interference.

One least-squares fit over a study's busy steps, both modes pooled (caching changes how many
prompt tokens a step computes, not what one costs)::

    step_ms = a + b * prefill_tokens + e * num_prefill_reqs + c * decode_tokens

``e`` is a per-prefill cost beyond its tokens: with caching ON a prefill computes 62 tokens but
attends to the whole 1214-token context, and pays a fixed per-request setup.  Without it the fit
charged ON's prefills 0.7 ms where they cost several.  Where the two prefill terms cannot be told
apart (one mode, fixed prompts: tokens = 1214 x requests) ``e`` is left out.

Per point, with the fitted prefill cost ``P = b * prefill_tokens + e * num_prefill_reqs`` of each step:

* **engine prefill share** = sum(P) / sum(step_ms): the share of busy engine time spent on prompts;
* **decode slowdown** = sum(decode_tokens * step_ms) / sum(decode_tokens * (step_ms - P)): how much
  longer, per decode token, steps were than the same steps without their prefill work.

Busy steps: rows timed inside the engine (``timing`` "engine") with step_ms > 0.  Runs timed at the
frontend ("frontend") only keep a step whose previous record had work in flight: the first record
after an idle spell carries the idle gap, which is not step time.  Backends without steps
("request": echo) have none.  Intervals: a moving-block
bootstrap of the steps (see ``metrics.bootstrap``) with the coefficients refitted on each resample.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from prefixstudy.metrics.bootstrap import N_BOOT, block_indices, interval, rate_seed
from prefixstudy.metrics.requests import KEY

TERMS = ("prefill_tokens", "num_prefill_reqs", "decode_tokens")
COEF_NAMES = ("a_ms", "b_ms_per_prefill_token", "e_ms_per_prefill_req", "c_ms_per_decode_token")


@dataclass
class StepFit:
    coef: np.ndarray  # a, b, e, c (e is 0 when it could not be identified)
    r2: float
    n: int
    rmse_ms: float
    draws: np.ndarray = field(default_factory=lambda: np.zeros((0, 4)))  # bootstrap coefficients

    def as_dict(self) -> dict:
        return {**dict(zip(COEF_NAMES, (float(c) for c in self.coef))), "r2": self.r2, "n": self.n,
                "rmse_ms": self.rmse_ms}


def busy_steps(iterations: pd.DataFrame) -> pd.DataFrame:
    """Steps that measure work (see the module docstring), in point and time order."""
    it = iterations.sort_values(KEY + ["t_s"], kind="stable")
    step = it["step_ms"].astype(float)
    work = (it["prefill_tokens"] + it["decode_tokens"]) > 0
    in_flight = (it["num_running"] + it["num_waiting"]) > 0
    prev_busy = in_flight.groupby([it[k] for k in KEY], sort=False).shift(1, fill_value=False).astype(bool)
    timed = (it["timing"] == "engine") | ((it["timing"] == "frontend") & prev_busy)
    keep = np.isfinite(step) & (step > 0) & work & timed
    return it[keep]


def _design(steps: pd.DataFrame) -> np.ndarray:
    return np.column_stack([np.ones(len(steps))] + [steps[t].to_numpy(float) for t in TERMS])


def _solve(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares; the per-request term is dropped (0) when it is not identifiable."""
    if np.linalg.matrix_rank(X) == X.shape[1]:
        return np.linalg.lstsq(X, y, rcond=None)[0]
    keep = [0, 1, 3]
    coef = np.zeros(4)
    coef[keep] = np.linalg.lstsq(X[:, keep], y, rcond=None)[0]
    return coef


def fit_step_cost(iterations: pd.DataFrame, *, n_boot: int = 200, seed: int = 0) -> StepFit | None:
    """The pooled fit over busy steps, with bootstrap draws of its coefficients; None when there
    are too few steps or no variation in what they computed."""
    steps = busy_steps(iterations)
    if len(steps) < 8:
        return None
    X, y = _design(steps), steps["step_ms"].to_numpy(float)
    if np.linalg.matrix_rank(X[:, [0, 1, 3]]) < 3:
        return None
    coef = _solve(X, y)
    resid = y - X @ coef
    ss_tot = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - float((resid ** 2).sum()) / ss_tot if ss_tot > 0 else 1.0
    rng = np.random.default_rng(seed)
    draws = []
    for _ in range(n_boot):
        idx = block_indices(len(y), rng)
        draws.append(_solve(X[idx], y[idx]))
    return StepFit(coef, r2, len(steps), float(np.sqrt((resid ** 2).mean())), np.asarray(draws))


def step_arrays(steps: pd.DataFrame) -> np.ndarray:
    """Busy steps as an (n, 4) array: prefill_tokens, num_prefill_reqs, decode_tokens, step_ms
    (resampling arrays is ~100x faster than resampling frames)."""
    return steps[list(TERMS) + ["step_ms"]].to_numpy(float)


def stats(a: np.ndarray, coef: np.ndarray) -> tuple[float, float]:
    """(engine prefill share, decode slowdown) of the steps ``a`` (``step_arrays``) under ``coef``."""
    prefill = coef[1] * a[:, 0] + coef[2] * a[:, 1]
    dec, step = a[:, 2], a[:, 3]
    total = step.sum()
    share = float(prefill.sum() / total) if total > 0 else math.nan
    without = (dec * (step - prefill)).sum()
    slowdown = float((dec * step).sum() / without) if without > 0 else math.nan
    return share, slowdown


def replicates(runs: list[np.ndarray], fit: StepFit, seed=0) -> np.ndarray:
    """(n_draws, 2) bootstrap replicates of ``stats`` over ``runs`` (one step array per repeat):
    repeats with replacement, then moving blocks of steps, each with its own coefficient draw."""
    rng = np.random.default_rng(seed)
    out = []
    for c in fit.draws[:N_BOOT]:
        picked = rng.integers(0, len(runs), size=len(runs)) if len(runs) > 1 else [0]
        out.append(stats(np.concatenate([runs[i][block_indices(len(runs[i]), rng)] for i in picked]), c))
    return np.asarray(out, dtype=float).reshape(-1, 2)


def point_seed(key) -> np.random.SeedSequence:
    """A point's own seed, from its identity: adding points to a run never moves another's interval."""
    mode, rate, repeat = key
    return np.random.SeedSequence([{"on": 1, "off": 2}.get(mode, 3), rate_seed(rate), int(repeat)])


ENGINE_COLUMNS = ["step_timing", "busy_steps", "engine_prefill_share", "engine_prefill_share_lo",
                  "engine_prefill_share_hi", "decode_slowdown", "decode_slowdown_lo", "decode_slowdown_hi"]


def engine_columns(iterations: pd.DataFrame, fit: StepFit | None) -> pd.DataFrame:
    """Per point (KEY): the engine columns of summary.csv."""
    rows = []
    busy = busy_steps(iterations) if len(iterations) else iterations
    for key, g in iterations.groupby(KEY, sort=True):
        b = busy[(busy["mode"] == key[0]) & (busy["rate"] == key[1]) & (busy["repeat"] == key[2])]
        row = dict(zip(KEY, key), step_timing=str(g["timing"].iloc[0]), busy_steps=len(b))
        share = slow = lo = hi = slo = shi = math.nan
        if fit is not None and len(b):
            a = step_arrays(b)
            share, slow = stats(a, fit.coef)
            reps = replicates([a], fit, seed=point_seed(key))
            (lo, hi), (slo, shi) = interval(reps[:, 0]), interval(reps[:, 1])
        row.update(engine_prefill_share=share, engine_prefill_share_lo=lo, engine_prefill_share_hi=hi,
                   decode_slowdown=slow, decode_slowdown_lo=slo, decode_slowdown_hi=shi)
        rows.append(row)
    return pd.DataFrame(rows, columns=KEY + ENGINE_COLUMNS)
