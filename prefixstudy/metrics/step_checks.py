"""Invariants of per-step timing: checks that would catch the step records being wrong.

The engine prefill share, the decode slowdown, the step-cost coefficients and the simulator all
rest on each step's step_ms being the time of that step's work.  Two checks, per mode:

* **A step that computes prompt tokens is not faster than a decode-only step of the same batch**
  (``prefill_not_faster``).  Adding prompt tokens to a batch adds work, so a step with prompt
  tokens is stochastically no faster than a decode-only step with the same decode tokens in the
  same point: at most half of them can be faster than that batch's median decode-only step.  The
  check fails when the share that is faster exceeds 1/2 beyond noise (a one-sided sign test,
  ``Z`` standard errors of a share of 1/2).
* **A fit on windowed sums agrees with the per-step fit** (``window_agreement``).  Summing
  ``WINDOW`` consecutive busy steps cancels any error that moves time between neighbouring records
  (a record closed one step late); the fit on those sums is the same ``engine_fit`` model.  The
  check fails when the two fits attribute more than ``TOLERANCE`` of a mode's busy time
  differently to prefill, to decode or in total.

Pure: frames in, a dict out (``check_steps``); the report prints it for every study.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from prefixstudy.metrics import engine_fit

WINDOW = 32
TOLERANCE = 0.05
Z = 3.0
MIN_DECODE_STEPS = 5  # decode-only steps a batch size needs in a point to have a median to compare with
MIN_WINDOWS = 8


def prefill_not_faster(busy: pd.DataFrame, z: float = Z) -> dict[str, dict]:
    """Per mode: ``n`` steps with prompt tokens that have a same-batch reference (>=
    MIN_DECODE_STEPS decode-only steps with the same decode tokens, same engine series),
    ``faster_share`` of them faster than that reference's median, ``bound`` = 1/2 + z / (2 sqrt(n)),
    the medians of both kinds, and ``ok``.  ``busy``: ``engine_fit.busy_steps``."""
    keys = engine_fit.engine_keys(busy) + ["decode_tokens"]
    dec = busy[busy["prefill_tokens"] == 0]
    ref = dec.groupby(keys)["step_ms"].agg(["median", "size"])
    ref = ref[ref["size"] >= MIN_DECODE_STEPS]
    pre = busy[busy["prefill_tokens"] > 0].join(ref, on=keys, how="inner")
    out = {}
    for mode in sorted(set(busy["mode"])):
        p = pre[pre["mode"] == mode]
        n = len(p)
        share = float((p["step_ms"] < p["median"]).mean()) if n else math.nan
        bound = 0.5 + z * 0.5 / math.sqrt(n) if n else math.nan
        out[mode] = {"n": n, "faster_share": share, "bound": bound,
                     "prefill_median_ms": float(p["step_ms"].median()) if n else math.nan,
                     "decode_median_ms": float(p["median"].median()) if n else math.nan,
                     "ok": bool(share <= bound) if n else None}
    return out


def windows(busy: pd.DataFrame, window: int = WINDOW) -> np.ndarray:
    """Sums of ``window`` consecutive busy steps of each engine series (full windows only), as
    rows of [mode index, design columns (``engine_fit.design``), cached_tokens, step_ms]."""
    modes = sorted(set(busy["mode"]))
    out = []
    for key, g in busy.groupby(engine_fit.engine_keys(busy), sort=True):
        k = len(g) // window
        if not k:
            continue
        a = np.column_stack([engine_fit.design(g), g["cached_tokens"].to_numpy(float), g["step_ms"].to_numpy(float)])
        sums = a[:k * window].reshape(k, window, -1).sum(axis=1)
        out.append(np.column_stack([np.full(k, modes.index(key[0])), sums]))
    return np.concatenate(out) if out else np.zeros((0, len(engine_fit.COEF_NAMES) + 3))


def _parts(X: np.ndarray, cached: np.ndarray, coef: np.ndarray) -> np.ndarray:
    """(prefill, decode, total) fitted ms summed over the rows of design ``X``."""
    prefill = coef[1] * X[:, 1] + coef[2] * X[:, 2] + coef[4] * (X[:, 1] + cached)
    total = X @ coef
    return np.array([prefill.sum(), (total - prefill - coef[0] * X[:, 0]).sum(), total.sum()])


def window_agreement(busy: pd.DataFrame, coef: np.ndarray, window: int = WINDOW,
                     tolerance: float = TOLERANCE) -> dict:
    """The fit on ``window``-step sums against the per-step coefficients ``coef`` (a, b, e, c, k).
    Returns the window fit's coefficients and R², each fit's RMSE on the windows, and per mode the
    differences in prefill, decode and total fitted time as shares of that mode's busy time, their
    largest (``max_diff``) and ``ok``; ``ok`` None with too few windows."""
    w = windows(busy, window)
    out: dict = {"window": window, "n_windows": len(w), "tolerance": tolerance}
    if len(w) < MIN_WINDOWS:
        return out | {"ok": None, "modes": {}}
    X, y = w[:, 1:-2], w[:, -1]
    fit = engine_fit.fit_arrays(X, y)
    coef = np.asarray(coef, dtype=float)
    out |= {"coef": dict(zip(engine_fit.COEF_NAMES, map(float, fit.coef), strict=True)), "r2": fit.r2,
            "rmse_ms_window_fit": fit.rmse_ms, "rmse_ms_step_fit": float(np.sqrt(((y - X @ coef) ** 2).mean()))}
    modes = sorted(set(busy["mode"]))
    out["modes"] = {}
    for mode in modes:
        b = busy[busy["mode"] == mode]
        Xm, cm, busy_ms = engine_fit.design(b), b["cached_tokens"].to_numpy(float), float(b["step_ms"].sum())
        d = np.abs(_parts(Xm, cm, coef) - _parts(Xm, cm, fit.coef)) / busy_ms
        out["modes"][mode] = {"prefill_diff": float(d[0]), "decode_diff": float(d[1]), "total_diff": float(d[2]),
                              "max_diff": float(d.max()), "ok": bool(d.max() <= tolerance)}
    out["ok"] = all(m["ok"] for m in out["modes"].values())
    return out


def check_steps(iterations: pd.DataFrame, coef: np.ndarray | None) -> dict | None:
    """Both checks on a study's iterations under its per-step coefficients; None where the study
    has no engine steps (or no fit).  ``ok``: False if either check fails, None if neither could run."""
    if iterations is None or not len(iterations) or coef is None:
        return None
    busy = engine_fit.busy_steps(iterations)
    if busy.empty:
        return None
    a = prefill_not_faster(busy)
    b = window_agreement(busy, coef)
    results = [m["ok"] for m in a.values()] + [b["ok"]]
    known = [r for r in results if r is not None]
    return {"prefill_not_faster": a, "window_agreement": b, "ok": all(known) if known else None}
