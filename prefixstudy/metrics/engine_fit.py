"""The engine step-time fit and the engine-level prefill share (see the package docstring)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from prefixstudy.metrics.requests import KEY

def _busy(iterations: pd.DataFrame) -> pd.DataFrame:
    it = iterations
    step = it["step_ms"].astype(float)
    work = it["prompt_tokens"].astype(float) + it["generation_tokens"].astype(float)
    return it[np.isfinite(step) & (step > 0) & (work > 0)]


def fit_step_cost(iterations: pd.DataFrame, by: str | None = None) -> pd.DataFrame:
    """Least squares ``step_ms = a + b*prompt_tokens + c*generation_tokens`` over busy iterations.

    Busy: finite step_ms > 0 and at least one token computed.  ``by=None`` pools all
    rows (group "pooled"); ``by="mode"`` fits each mode.  Columns: group, a_ms,
    b_ms_per_prompt_token, c_ms_per_gen_token, r2, n.  NaN coefficients when the
    design is rank-deficient (e.g. prompt_tokens constant).
    """
    busy = _busy(iterations)
    groups = [("pooled", busy)] if by is None else list(busy.groupby(by, sort=True))
    rows = []
    for name, g in groups:
        X = np.column_stack([np.ones(len(g)), g["prompt_tokens"].to_numpy(float),
                             g["generation_tokens"].to_numpy(float)])
        y = g["step_ms"].to_numpy(float)
        coef = np.full(3, math.nan)
        r2 = math.nan
        if len(g) >= 3 and np.linalg.matrix_rank(X) == 3:
            coef, *_ = np.linalg.lstsq(X, y, rcond=None)
            ss_tot = float(((y - y.mean()) ** 2).sum())
            ss_res = float(((y - X @ coef) ** 2).sum())
            r2 = 1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0
        rows.append({"group": name, "a_ms": float(coef[0]), "b_ms_per_prompt_token": float(coef[1]),
                     "c_ms_per_gen_token": float(coef[2]), "r2": r2, "n": int(len(g))})
    return pd.DataFrame(rows, columns=["group", "a_ms", "b_ms_per_prompt_token",
                                       "c_ms_per_gen_token", "r2", "n"])


def engine_prefill_share(iterations: pd.DataFrame, fit: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per point: b * sum(prompt_tokens) / sum(step_ms) over busy iterations.

    ``fit`` defaults to the pooled ``fit_step_cost``.  Columns: mode, rate,
    prompt_tokens, busy_ms, prefill_share_engine.
    """
    fit = fit_step_cost(iterations) if fit is None else fit
    b = float(fit["b_ms_per_prompt_token"].iloc[0])
    busy = _busy(iterations)
    g = busy.groupby(KEY, sort=True).agg(prompt_tokens=("prompt_tokens", "sum"),
                                         busy_ms=("step_ms", "sum")).reset_index()
    g["prefill_share_engine"] = b * g["prompt_tokens"] / g["busy_ms"]
    return g
