"""Invariants of per-step timing: checks that would catch the step records being wrong.

The engine prefill share, the decode slowdown, the step-cost coefficients and the simulator all
rest on each step's step_ms being the time of that step's work.  The checks, per mode:

* **Pairwise** (``pairwise``): a step that computes prompt tokens right after a decode-only step,
  with at least as many decode tokens, does more work than that step, so it cannot take less time
  beyond noise (``PAIR_NOISE_MS`` or ``PAIR_NOISE_SHARE`` of the decode step, whichever is more).
  The check fails when more than ``PAIR_SHARE_MAX`` of such pairs are shorter.  It runs on every
  engine-stamped row, fitted or not: the host stamps of vLLM's async engine fail it (ON prompt
  steps 3.2 ms after 5.2 ms decode-only ones), the same steps' GPU spans pass.
* **Same batch** (``prefill_not_faster``): at most half of the steps with prompt tokens may be
  faster than the median decode-only step of the same batch in the same point (a one-sided sign
  test, ``Z`` standard errors of a share of 1/2).  Weaker than the pairwise check: a median over a
  whole point passes records that are shifted only around prompt steps.
* **Windows** (``window_agreement``): summing ``WINDOW`` consecutive busy steps cancels any error
  that moves time between neighbouring records; the fit on those sums (the same ``engine_fit``
  model) must attribute the same busy time to prefill, to decode and in total, within ``TOLERANCE``.
* **Busy time** (``busy_time``): a point's step durations add up to no more than the wall time from
  its first step's start to its last step's end (``BUSY_TOLERANCE``): a timer that counted some
  work twice, or spans that overlap, break it.

Pure: frames in, a dict out (``check_steps``); the report prints it for every study and
``prefixstudy check`` exits non-zero when a check fails.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from prefixstudy.costmodel import engine_fit

WINDOW = 32
TOLERANCE = 0.05
Z = 3.0
MIN_DECODE_STEPS = 5  # decode-only steps a batch size needs in a point to have a median to compare with
MIN_WINDOWS = 8
# Pairwise: decode-only steps of one batch size on one H200 vary by well under 1 ms; a CPU engine's
# steps are longer and noisier, hence the relative part.
PAIR_NOISE_MS = 1.0
PAIR_NOISE_SHARE = 0.1
PAIR_SHARE_MAX = 0.05
MIN_PAIRS = 20
BUSY_TOLERANCE = 0.005
# Rows whose step_ms comes from the engine's own clocks (engines.step_log.TIMING_METHODS); the
# checks judge these whether or not the fit may use them.
ENGINE_TIMED = ("engine", "engine-async", "gpu-span")


def engine_rows(iterations: pd.DataFrame) -> pd.DataFrame:
    """Engine-stamped steps with work, in engine and time order."""
    it = iterations[iterations["timing"].isin(ENGINE_TIMED)
                    & ((iterations["prefill_tokens"] + iterations["decode_tokens"]) > 0)]
    return it.sort_values(engine_fit.engine_keys(it) + ["t_s"], kind="stable")


def pairs(it: pd.DataFrame, column: str = "step_ms") -> pd.DataFrame:
    """(decode-only step, the next step if it computes prompt tokens and at least as many decode
    tokens) of each engine series, back to back (the second starts within 1 ms of the first's end):
    mode, rate, decode_ms, prefill_ms."""
    out = []
    for key, g in it.groupby(engine_fit.engine_keys(it), sort=True):
        prev, cur = g.iloc[:-1].reset_index(drop=True), g.iloc[1:].reset_index(drop=True)
        m = ((prev["prefill_tokens"] == 0) & (cur["prefill_tokens"] > 0)
             & (cur["decode_tokens"] >= prev["decode_tokens"]) & (cur["step_start_s"] - prev["t_s"] < 1e-3))
        out.append(pd.DataFrame({"mode": key[0], "rate": key[1], "decode_ms": prev.loc[m, column].to_numpy(float),
                                 "prefill_ms": cur.loc[m, column].to_numpy(float)}))
    return pd.concat(out, ignore_index=True) if out else pd.DataFrame(columns=["mode", "rate", "decode_ms", "prefill_ms"])


def pairwise(it: pd.DataFrame, column: str = "step_ms") -> dict[str, dict]:
    """Per mode: ``n`` pairs (``pairs``), ``shorter`` of them whose prompt step took less than the
    decode-only step before it minus the noise, their ``share`` and ``ok`` (share <=
    PAIR_SHARE_MAX; None under MIN_PAIRS pairs)."""
    p = pairs(it, column)
    out = {}
    for mode in sorted(set(it["mode"])):
        g = p[p["mode"] == mode]
        noise = np.maximum(PAIR_NOISE_MS, PAIR_NOISE_SHARE * g["decode_ms"])
        shorter = int((g["prefill_ms"] < g["decode_ms"] - noise).sum())
        n = len(g)
        out[mode] = {"n": n, "shorter": shorter, "share": shorter / n if n else math.nan, "max_share": PAIR_SHARE_MAX,
                     "column": column, "ok": bool(shorter / n <= PAIR_SHARE_MAX) if n >= MIN_PAIRS else None}
    return out


def busy_time(it: pd.DataFrame) -> dict[str, dict]:
    """Per mode: over its points (engine series), the largest ratio of the summed step_ms to the wall
    time from the first step's start to the last step's end (``worst``, and which point), and ``ok``
    (every ratio <= 1 + BUSY_TOLERANCE)."""
    out = {}
    for mode in sorted(set(it["mode"])):
        worst, where = 0.0, None
        for key, g in it[it["mode"] == mode].groupby(engine_fit.engine_keys(it), sort=True):
            wall_ms = (g["t_s"].max() - g["step_start_s"].min()) * 1e3
            ratio = float(g["step_ms"].sum() / wall_ms) if wall_ms > 0 else math.inf
            if ratio > worst:
                worst, where = ratio, {"rate": float(key[1]), "repeat": int(key[2])}
        out[mode] = {"worst": worst, "at": where, "tolerance": BUSY_TOLERANCE,
                     "ok": bool(worst <= 1 + BUSY_TOLERANCE) if where else None}
    return out


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
    """Every check on a study's iterations; the windows under its per-step coefficients ``coef``
    (None: no fit, windows not judged).  None where the study has no engine-stamped or fitted steps.  ``ok``:
    False if any check fails, None if none could run.  ``pairwise_host`` is the pairwise check on
    the host stamps of steps timed on the GPU: what those stamps alone would have said (not judged)."""
    if iterations is None or not len(iterations):
        return None
    it, busy = engine_rows(iterations), engine_fit.busy_steps(iterations)
    if it.empty and busy.empty:
        return None
    out = {"pairwise": pairwise(it) if len(it) else {},
           "prefill_not_faster": prefill_not_faster(busy) if len(busy) else {},
           "window_agreement": (window_agreement(busy, coef) if coef is not None and len(busy)
                                else {"ok": None, "n_windows": 0, "window": WINDOW, "modes": {}}),
           "busy_time": busy_time(it) if len(it) else {}}
    gpu = it[it["timing"] == "gpu-span"]
    if len(gpu) and "host_step_ms" in gpu and gpu["host_step_ms"].notna().all():
        out["pairwise_host"] = pairwise(gpu, "host_step_ms")
    results = ([m["ok"] for m in out["pairwise"].values()] + [m["ok"] for m in out["prefill_not_faster"].values()]
               + [out["window_agreement"]["ok"]] + [m["ok"] for m in out["busy_time"].values()])
    known = [r for r in results if r is not None]
    out["ok"] = all(known) if known else None
    return out
