"""The report's "A model that closes the loop": model.closure's TPOT and knee beside the measured ones."""

from __future__ import annotations

import math

import pandas as pd

from prefixstudy.config.arms import arm_label
from prefixstudy.metrics.requests import counted
from prefixstudy.model.closure import admission_limit, arm_table
from prefixstudy.report.data import ReportData

TEXT = ("From the step-cost fit alone (model.closure): each request brings w ms of engine work (its prompt's and "
        "its decodes'), every step pays a, and a busy engine's step lasts TPOT ≈ a / (1 − λ·w), which grows "
        "without bound at λ = 1/w, the arm's instability rate. Before that, the requests in the engine, λ·E2E, "
        "reach 80 % of its admission limit, where the saturation detector calls the point full. The model's knee "
        "is the lower of the two; the measured bracket is the knees sentence's. Mean TPOT, model against "
        "measurement, at the points where the arm kept up in every repeat.")


def table(d: ReportData) -> pd.DataFrame:
    """model.closure.arm_table, worded for the report: per arm, w, the instability and "full" rates, the
    model's knee beside the measured bracket, and the largest TPOT error at the arm's calm rates."""
    t = arm_table(d.coef, d.head, counted(d.study.requests), admission_limit(d.study.manifest), d.arms)
    return pd.DataFrame([{
        "arm": arm_label(r.arm), "work per request (ms)": f"{r.work_ms:.1f}",
        "unstable at (req/s)": f"{r.unstable_rate:.1f}",
        "full at (req/s)": f"{r.full_rate:.1f}" if math.isfinite(r.full_rate) else "–",
        "model knee (req/s)": f"{r.knee_rate:.1f}",
        "measured knee (req/s)": bracket_words(r.knee_lo, r.knee_hi),
        "model in bracket": r.inside,
        "TPOT model / measured, worst calm rate": (
            f"{r.worst_tpot_ms_model:.2f} / {r.worst_tpot_ms_measured:.2f} ms at {r.worst_rate:.1f} req/s "
            f"({100 * (r.worst_tpot_ms_model / r.worst_tpot_ms_measured - 1):+.0f} %)"
            if math.isfinite(r.worst_rate) else "–"),
    } for r in t.itertuples()])


def bracket_words(lo: float, hi: float) -> str:
    return f"{lo:.1f}–{hi:.1f}" if math.isfinite(hi) else f"> {lo:.1f}" if math.isfinite(lo) else "–"


PHYSICS_TEXT = ("The fitted coefficients beside the least time the GPU's datasheet allows for their work "
                "(model.closure.physics): share = that floor / the coefficient, the part of it the GPU's work "
                "explains at peak; the rest is below-peak kernels, launch gaps and host work. A prefilling "
                "request brings no GPU work beyond its tokens: its coefficient is host or launch overhead.")


def physics_table(d: ReportData) -> pd.DataFrame:
    """``model.closure.physics`` for the study's model and GPU; empty when either is unknown."""
    from prefixstudy.configs import recorded_model_dir
    from prefixstudy.costmodel.arch import load_arch
    from prefixstudy.model.closure import physics
    from prefixstudy.costmodel.gpus import find_gpu

    gpu = find_gpu(str(d.study.manifest.get("device") or ""))
    model = recorded_model_dir(str((d.study.config or {}).get("model") or ""))
    if gpu is None or d.coef is None or model is None:
        return pd.DataFrame()
    req = counted(d.study.requests)
    context = float((req["prompt_tokens"] + req["output_tokens"] / 2).mean())
    t = physics(d.coef, load_arch(model), gpu, context)
    return pd.DataFrame({"coefficient": t["coefficient"], "per": t["per"], "fitted (ms)": t["fitted_ms"].map("{:.4f}".format),
                         "datasheet floor (ms)": t["floor_ms"].map("{:.4f}".format), "floor is": t["floor_is"],
                         "share": t["share"].map(lambda v: f"{100 * v:.0f} %")})
