"""The engine's step cost: one fit, used by the report (engine prefill share, interference) and by
the simulator (``costmodel.step_cost`` prices its steps with it).

One non-negative least-squares fit over a study's busy steps, both modes pooled (caching changes
how many prompt tokens a step computes, not what one costs)::

    step_ms = a + b * prefill_tokens + e * num_prefill_reqs + c * decode_tokens + k * context_tokens

* ``e`` is a per-prefill cost beyond its tokens: with caching ON a prefill computes 62 tokens but
  attends to the whole 1214-token context and pays a fixed setup (vLLM runs mixed batches outside
  its full CUDA graphs).  Where it cannot be told apart from ``b`` (fixed prompts and no cache:
  tokens = 1214 x requests) it is 0.
* ``k`` is attention over the context (KV tokens the scheduled requests attend to).  It is kept
  only where it lowers the residual sum of squares by ``CONTEXT_GAIN`` or more: with one prompt
  length the context is decode tokens x ~1300, the pair is nearly collinear, and a split the data
  do not pin down would be scaled differently by the simulator's roofline.
* Every coefficient is >= 0 (Lawson-Hanson NNLS): a step that computes more never costs less, and
  no prefill share can come out negative.  Plain least squares gave a -3.42 ms prefill-request term
  on h200-multiturn.

Per point, with the fitted prefill cost ``P = b * prefill_tokens + e * num_prefill_reqs
+ k * (prefill_tokens + cached_tokens)`` of each step (the context a prefilling request attends):

* **engine prefill share** = sum(P) / sum(step_ms): the share of busy engine time spent on prompts;
* **decode slowdown** = sum(decode_tokens * step_ms) / sum(decode_tokens * (step_ms - P)): how much
  longer, per decode token, steps were than the same steps without their prefill work.

Busy steps: rows with work and step_ms > 0, timed as one step's cost (``timing`` "engine" or
"gpu-span"), or at
the frontend ("frontend": step_ms is the gap since the previous record) when the previous record
of the same engine left requests in flight: the first record after an idle spell carries the idle
gap, which is not step time.  Backends without steps ("request": echo) have none.  Intervals: a
moving-block bootstrap of the steps (``shared.bootstrap``), coefficients refitted on each resample.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from prefixstudy.shared.bootstrap import N_BOOT, block_indices, interval, rate_seed
from prefixstudy.schema import KEY

TERMS = ("prefill_tokens", "num_prefill_reqs", "decode_tokens", "context_tokens")
COEF_NAMES = ("a_ms", "b_ms_per_prefill_token", "e_ms_per_prefill_req", "c_ms_per_decode_token",
              "k_ms_per_context_token")
# Columns of ``step_arrays``: the terms, then what the prefill share needs, then the time.
ARRAY_COLUMNS = TERMS + ("cached_tokens", "step_ms")
# Timings whose step_ms is one step's own cost (engines.step_log.TIMING_METHODS).
PER_STEP = ("engine", "gpu-span")
CONTEXT_GAIN = 0.01  # the context term stays when it removes >= 1 % of the residual sum of squares


@dataclass
class StepFit:
    coef: np.ndarray  # a, b, e, c, k (0 where a term is not identified or not kept)
    r2: float
    n: int
    rmse_ms: float
    residual_ms: dict[str, float] = field(default_factory=dict)  # mean, std, p50/p90/p99 of |residual|
    draws: np.ndarray = field(default_factory=lambda: np.zeros((0, len(COEF_NAMES))))  # bootstrap coefficients

    def as_dict(self) -> dict:
        return {**dict(zip(COEF_NAMES, (float(c) for c in self.coef), strict=True)), "r2": self.r2, "n": self.n,
                "rmse_ms": self.rmse_ms, "method": "nnls",
                "residual_ms": dict(self.residual_ms)}


def engine_keys(df: pd.DataFrame) -> list[str]:
    """What identifies one engine's step series: the point, and the replica in a fleet."""
    return KEY + (["replica"] if "replica" in df else [])


def busy_steps(iterations: pd.DataFrame) -> pd.DataFrame:
    """Steps that measure work (see the module docstring), in engine and time order."""
    keys = engine_keys(iterations)
    it = iterations.sort_values(keys + [c for c in ("t_s",) if c in iterations], kind="stable")
    step = it["step_ms"].astype(float)
    work = (it["prefill_tokens"] + it["decode_tokens"]) > 0
    if {"num_running", "num_waiting"} <= set(it):
        in_flight = (it["num_running"] + it["num_waiting"]) > 0
    else:
        in_flight = work
    prev_busy = in_flight.groupby([it[k] for k in keys], sort=False).shift(1, fill_value=False).astype(bool)
    timed = it["timing"].isin(PER_STEP) | ((it["timing"] == "frontend") & prev_busy)
    keep = np.isfinite(step) & (step > 0) & work & timed
    return it[keep]


# ----------------------------------------------------------------- non-negative least squares

def nnls(A: np.ndarray, b: np.ndarray, max_iter: int = 100) -> np.ndarray:
    """x >= 0 minimising |A x - b| (Lawson and Hanson's active set, on the normal equations: the
    designs here are tall and have at most five columns).  Columns are scaled to unit norm first."""
    scale = np.linalg.norm(A, axis=0)
    scale[scale == 0] = 1.0
    G = (A / scale).T @ (A / scale)
    h = (A / scale).T @ b
    n = len(h)
    x, passive = np.zeros(n), np.zeros(n, dtype=bool)
    tol = 1e-12 * max(1.0, float(np.abs(h).max(initial=0.0)))
    for _ in range(max_iter * n):
        w = h - G @ x
        free = ~passive & (w > tol)
        if not free.any():
            break
        passive[np.argmax(np.where(free, w, -np.inf))] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(G[np.ix_(passive, passive)], h[passive], rcond=None)[0]
            if (z[passive] > 0).all():
                x = z
                break
            neg = passive & (z <= 0)
            alpha = float(np.min(x[neg] / (x[neg] - z[neg])))
            x = x + alpha * (z - x)
            passive &= x > tol
            x[~passive] = 0.0
    return x / scale


def identified(X: np.ndarray) -> list[int]:
    """Columns of ``X`` in order, each kept only if it is not a linear combination of the ones kept
    before it (on unit-norm columns, so the units of a term do not decide)."""
    norm = np.linalg.norm(X, axis=0)
    Z = X / np.where(norm > 0, norm, 1.0)
    keep: list[int] = []
    for j in range(X.shape[1]):
        if norm[j] > 0 and np.linalg.matrix_rank(Z[:, keep + [j]], tol=1e-9 * len(Z) ** 0.5) == len(keep) + 1:
            keep.append(j)
    return keep


def columns(X: np.ndarray, y: np.ndarray) -> list[int]:
    """Which columns of design ``X`` the fit of ``y`` uses: the identified ones, the context column
    only where it earns its place (module docstring)."""
    cols = identified(X)
    if 4 not in cols:
        return cols
    base = [j for j in cols if j != 4]
    c0, c1 = nnls(X[:, base], y), nnls(X[:, cols], y)
    sse0, sse1 = float(((y - X[:, base] @ c0) ** 2).sum()), float(((y - X[:, cols] @ c1) ** 2).sum())
    return cols if c1[cols.index(4)] > 0 and sse1 <= (1 - CONTEXT_GAIN) * sse0 else base


def solve(X: np.ndarray, y: np.ndarray, cols: list[int] | None = None) -> np.ndarray:
    """The coefficients (a, b, e, c, k) of design ``X`` (``design`` columns) for times ``y``: NNLS on
    ``cols`` (by default ``columns(X, y)``), 0 elsewhere."""
    cols = columns(X, y) if cols is None else cols
    coef = np.zeros(X.shape[1])
    coef[cols] = nnls(X[:, cols], y)
    return coef


def design(steps: pd.DataFrame) -> np.ndarray:
    return np.column_stack([np.ones(len(steps))] + [steps[t].to_numpy(float) if t in steps else
                                                    np.zeros(len(steps)) for t in TERMS])


def residual_stats(resid: np.ndarray) -> dict[str, float]:
    a = np.abs(resid)
    return {"mean": float(resid.mean()), "std": float(resid.std()), "p50_abs": float(np.percentile(a, 50)),
            "p90_abs": float(np.percentile(a, 90)), "p99_abs": float(np.percentile(a, 99))}


def fit_arrays(X: np.ndarray, y: np.ndarray, *, n_boot: int = 0, seed=0) -> StepFit:
    """``solve`` with R², residuals and ``n_boot`` moving-block bootstrap refits (on the columns the
    full fit chose, so a resample cannot swap one term for a collinear one)."""
    cols = columns(X, y)
    coef = solve(X, y, cols)
    resid = y - X @ coef
    ss_tot = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - float((resid ** 2).sum()) / ss_tot if ss_tot > 0 else 1.0
    rng = np.random.default_rng(seed)
    draws = [solve(X[idx], y[idx], cols) for idx in (block_indices(len(y), rng) for _ in range(n_boot))]
    return StepFit(coef, r2, len(y), float(np.sqrt((resid ** 2).mean())), residual_stats(resid),
                   np.asarray(draws).reshape(-1, len(COEF_NAMES)))


def fit_step_cost(iterations: pd.DataFrame, *, n_boot: int = 200, seed: int = 0) -> StepFit | None:
    """The pooled fit over busy steps, with bootstrap draws of its coefficients; None when there
    are too few steps or no variation in what they computed."""
    steps = busy_steps(iterations)
    if len(steps) < 8:
        return None
    X = design(steps)
    if not {1, 3} <= set(identified(X[:, :4])):  # prefill and decode tokens must both vary
        return None
    return fit_arrays(X, steps["step_ms"].to_numpy(float), n_boot=n_boot, seed=seed)


def recorded_coef(fit) -> np.ndarray:
    """A recorded fit's coefficients in ``COEF_NAMES`` order (the manifest's ``step_fit``, or a row of
    it): a term it does not hold is 0."""
    return np.array([float(fit.get(k, 0.0) or 0.0) for k in COEF_NAMES])


def fit_by_kind(iterations: pd.DataFrame, coef: np.ndarray) -> list[dict]:
    """How well the pooled fit explains each arm's steps that carry prompt tokens ("mixed") and its
    decode-only steps, apart: a pooled R² near 1 can come from the spread between OFF's long prefill
    steps and everything else while saying little about one arm's short steps.  Per arm and kind:
    steps, R², RMSE and mean step (ms)."""
    steps = busy_steps(iterations)
    if steps.empty:
        return []
    y = steps["step_ms"].to_numpy(float)
    resid = y - design(steps) @ np.asarray(coef, float)
    mixed = steps["prefill_tokens"].to_numpy() > 0
    rows = []
    for arm in dict.fromkeys(steps["mode"].astype(str)):
        for kind, sel in (("mixed", mixed), ("decode-only", ~mixed)):
            s = (steps["mode"].astype(str).to_numpy() == arm) & sel
            if s.sum() < 2:
                continue
            yy, rr = y[s], resid[s]
            ss = float(((yy - yy.mean()) ** 2).sum())
            rows.append({"mode": arm, "kind": kind, "n": int(s.sum()),
                         "r2": 1.0 - float((rr ** 2).sum()) / ss if ss > 0 else None,
                         "rmse_ms": float(np.sqrt((rr ** 2).mean())), "mean_ms": float(yy.mean())})
    return rows


def step_arrays(steps: pd.DataFrame) -> np.ndarray:
    """Busy steps as an (n, 6) array of ``ARRAY_COLUMNS`` (resampling arrays is ~100x faster than
    resampling frames)."""
    return np.column_stack([steps[c].to_numpy(float) if c in steps else np.zeros(len(steps))
                            for c in ARRAY_COLUMNS])


def prefill_ms(a: np.ndarray, coef: np.ndarray) -> np.ndarray:
    """The fitted prefill cost P of each step of ``a`` (``step_arrays``): its prompt tokens, its
    prefilling requests, and the context those requests attend."""
    return coef[1] * a[:, 0] + coef[2] * a[:, 1] + coef[4] * (a[:, 0] + a[:, 4])


def stats(a: np.ndarray, coef: np.ndarray) -> tuple[float, float]:
    """(engine prefill share, decode slowdown) of the steps ``a`` (``step_arrays``) under ``coef``."""
    prefill = prefill_ms(a, coef)
    dec, step = a[:, 2], a[:, 5]
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
        row = dict(zip(KEY, key, strict=True), step_timing=str(g["timing"].iloc[0]), busy_steps=len(b))
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
