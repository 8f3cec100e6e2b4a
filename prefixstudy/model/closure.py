"""A model that closes the loop from the fitted step costs to TPOT and the knee.

The step-cost fit (``costmodel.engine_fit``) prices a step as ``a`` plus work per prompt token,
prefilling request, decode token and context token.  An engine that keeps up does, per second, the
work the requests arriving in that second bring: each request's prompt work and its decodes,

    w = b·uncached + e + k·prompt + (O - 1)·(c + k·(prompt + O/2))    (ms of engine time)

while every step also pays ``a``.  A busy engine's step then lasts T with T = a + λ·T·w/1000 (the
work arriving during a step is the work a step does), so

    TPOT ≈ T = a / (1 - λ·w/1000),

which grows without bound as λ nears 1000/w: the arm's instability rate.  Before that, the
requests in the engine, λ·E2E with E2E ≈ TTFT + (O - 1)·TPOT, reach the admission limit
(``max_num_seqs``): the rate where they pass ``FULL_LEVEL`` of it is the saturation detector's "ran
full" (``metrics.saturation``), and the model's knee is the lower of the two.

The model holds each step's cost at its mean and leaves out the variance of the batch and the
timing of prefill chunks; where it departs from the measurement is itself the finding.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from prefixstudy.metrics.headline import knee_bracket
from prefixstudy.metrics.saturation import FULL_LEVEL


def request_work_ms(coef, prompt: float, cached: float, output: float) -> float:
    """Engine time one request adds, ms: its prompt's work and its decodes' (``coef``: a, b, e, c, k)."""
    _, b, e, c, k = (float(x) for x in coef)
    return b * (prompt - cached) + e + k * prompt + (output - 1) * (c + k * (prompt + output / 2))


def tpot_ms(coef, work_ms: float, rate: float) -> float:
    """a / (1 - λ·w): a busy engine's step time at ``rate`` req/s; inf past the instability rate."""
    load = rate * work_ms / 1e3
    return float(coef[0]) / (1 - load) if load < 1 else math.inf


def arm_prediction(coef, prompt: float, cached: float, output: float, ttft_ms: float,
                   limit: int | None) -> dict:
    """The arm's instability rate (1000 / w), the rate where λ·E2E reaches FULL_LEVEL of ``limit``
    (NaN without one) and the knee, the lower of the two."""
    w = request_work_ms(coef, prompt, cached, output)
    unstable = 1e3 / w
    full = math.nan
    if limit:
        grid = np.linspace(unstable / 1000, unstable, 1000, endpoint=False)
        in_system = grid * (ttft_ms + (output - 1) * np.array([tpot_ms(coef, w, r) for r in grid])) / 1e3
        over = np.flatnonzero(in_system >= FULL_LEVEL * limit)
        full = float(grid[over[0]]) if len(over) else math.nan
    return {"work_ms": w, "unstable_rate": unstable, "full_rate": full,
            "knee_rate": min(unstable, full) if math.isfinite(full) else unstable}


def closure(coef, head: pd.DataFrame, workload: dict[str, tuple[float, float, float]], limit: int | None) -> pd.DataFrame:
    """Per arm and rate of ``head`` (headline.csv): predicted and measured mean TPOT, and the arm's
    predicted knee beside it.  ``workload``: arm -> (prompt tokens, cached tokens, output tokens),
    the request means of the study."""
    rows = []
    for arm, (prompt, cached, output) in workload.items():
        ttft = float(head[f"{arm}_mean_ttft_ms"].iloc[0]) if f"{arm}_mean_ttft_ms" in head else 0.0
        pred = arm_prediction(coef, prompt, cached, output, ttft, limit)
        for _, h in head.sort_values("arrival_rate").iterrows():
            rows.append({"mode": arm, "rate": float(h["rate"]), "arrival_rate": float(h["arrival_rate"]),
                         "saturated_share": float(h.get(f"{arm}_saturated_share", math.nan)),
                         "tpot_ms_measured": float(h[f"{arm}_mean_tpot_ms"]),
                         "tpot_ms_model": tpot_ms(coef, pred["work_ms"], float(h["arrival_rate"])), **pred})
    return pd.DataFrame(rows)


def fitted_coef(manifest: dict) -> np.ndarray | None:
    """The step-cost fit's coefficients as the run recorded them (``engine_fit.COEF_NAMES``); None
    without a fit."""
    from prefixstudy.costmodel.engine_fit import recorded_coef

    f = manifest.get("step_fit")
    return recorded_coef(f) if f else None


def study_workload(requests: pd.DataFrame, arms) -> dict[str, tuple[float, float, float]]:
    """arm -> (prompt, cached, output tokens), the means over ``requests`` (the counted ones) of each
    of ``arms`` that has them."""
    have = requests[requests["mode"].isin(list(arms))]
    return {str(m): (float(g["prompt_tokens"].mean()), float(g["num_cached_tokens"].mean()),
                     float(g["output_tokens"].mean())) for m, g in have.groupby("mode")}


def admission_limit(manifest: dict) -> int | None:
    """The engine's ``max_num_seqs`` as the run recorded it per point (None: not recorded)."""
    pts = manifest.get("points") or []
    lim = next((p.get("admission_limit") for p in pts if p.get("admission_limit")), None)
    return int(lim) if lim else None


def arm_table(coef, head: pd.DataFrame, requests: pd.DataFrame, limit: int | None, arms) -> pd.DataFrame:
    """Per arm of ``arms`` that headline.csv has: its work per request, instability and "full" rates, the
    model's knee beside the measured bracket (``metrics.headline.knee_bracket``), and the worst mean-TPOT
    error at the rates where it kept up in every repeat.  Numbers, not text; empty without a fit."""
    if coef is None or head.empty:
        return pd.DataFrame()
    workload = study_workload(requests, [a for a in arms if f"{a}_mean_tpot_ms" in head])
    return arm_summary(closure(coef, head, workload, limit), head) if workload else pd.DataFrame()


def arm_summary(c: pd.DataFrame, head: pd.DataFrame) -> pd.DataFrame:
    """``arm_table`` from ``closure``'s per-rate frame ``c``."""
    rows = []
    for arm, g in c.groupby("mode", sort=False):
        calm = g[g["saturated_share"] == 0]
        err = calm["tpot_ms_model"] / calm["tpot_ms_measured"] - 1
        worst = calm.loc[err.abs().idxmax()] if len(calm) else None
        b = knee_bracket(head, arm)
        first = g.iloc[0]
        rows.append({"arm": arm, "work_ms": first["work_ms"], "unstable_rate": first["unstable_rate"],
                     "full_rate": first["full_rate"], "knee_rate": first["knee_rate"],
                     "knee_lo": b["lo"], "knee_hi": b["hi"], "inside": inside(first["knee_rate"], b),
                     "worst_rate": worst["arrival_rate"] if worst is not None else math.nan,
                     "worst_tpot_ms_model": worst["tpot_ms_model"] if worst is not None else math.nan,
                     "worst_tpot_ms_measured": worst["tpot_ms_measured"] if worst is not None else math.nan})
    return pd.DataFrame(rows)


def inside(knee: float, bracket: dict) -> str:
    """Whether the model's knee falls in the measured bracket: "yes", "no: below" or "no: above"."""
    lo = bracket["lo"] if math.isfinite(bracket["lo"]) else 0.0
    hi = bracket["hi"] if math.isfinite(bracket["hi"]) else math.inf
    if lo <= knee <= hi:
        return "yes"
    return "no: below" if knee < lo else "no: above"


def physics(coef, arch, gpu, context_tokens: float, dtype_bytes: int = 2) -> pd.DataFrame:
    """Each fitted coefficient beside what the GPU's datasheet says its work must take at least:
    a step reads every weight once (``a`` against weight bytes / HBM bandwidth), a prompt token
    costs 2 x params FLOPs (``b`` against the peak bf16 rate), a decode token its FLOPs and its
    context's K and V (``c`` against the larger of the two, at ``context_tokens`` of context); a
    prefilling request brings no work of its own beyond its tokens, so ``e`` is host or launch
    overhead.  ``share`` = floor / coefficient: the part of the coefficient the GPU's work explains
    at peak."""
    from prefixstudy.costmodel.roofline import decode_work, prefill_work

    a, b, e, c, k = (float(x) for x in coef)
    weights_ms = prefill_work(arch, 1, 0, dtype_bytes).weight_bytes / (gpu.hbm_gb_s * 1e9) * 1e3
    token_ms = prefill_work(arch, 1, 0, dtype_bytes).matmul_flops / (gpu.bf16_tflops * 1e12) * 1e3
    dec = decode_work(arch, 1, context_tokens, dtype_bytes)
    decode_ms = max(dec.flops / (gpu.bf16_tflops * 1e12), dec.kv_bytes / (gpu.hbm_gb_s * 1e9)) * 1e3
    rows = [("a_ms", "a step", a, weights_ms, "read every weight once"),
            ("b_ms_per_prefill_token", "a prompt token", b, token_ms, "2 x params FLOPs at peak"),
            ("e_ms_per_prefill_req", "a prefilling request", e, 0.0, "no GPU work of its own: host and launch"),
            ("c_ms_per_decode_token", "a decode token", c, decode_ms,
             f"its FLOPs or its {context_tokens:.0f}-token context's K and V, whichever is slower")]
    return pd.DataFrame([{"coefficient": n, "per": p, "fitted_ms": v, "floor_ms": f, "floor_is": why,
                          "share": f / v if v > 0 else math.nan} for n, p, v, f, why in rows])
