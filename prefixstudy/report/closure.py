"""The report's "A model that closes the loop": model.closure's TPOT and knee beside the measured ones."""

from __future__ import annotations

import math

import pandas as pd

from prefixstudy.arms import arm_label
from prefixstudy.metrics.headline import knee_bracket
from prefixstudy.metrics.requests import counted
from prefixstudy.model.closure import closure
from prefixstudy.report.data import ReportData

TEXT = ("From the step-cost fit alone (model.closure): each request brings w ms of engine work (its prompt's and "
        "its decodes'), every step pays a, and a busy engine's step lasts TPOT ≈ a / (1 − λ·w), which grows "
        "without bound at λ = 1/w, the arm's instability rate. Before that, the requests in the engine, λ·E2E, "
        "reach 80 % of its admission limit, where the saturation detector calls the point full. The model's knee "
        "is the lower of the two; the measured bracket is the knees sentence's. Mean TPOT, model against "
        "measurement, at the points where the arm kept up in every repeat.")


def limit(d: ReportData) -> int | None:
    pts = d.study.manifest.get("points") or []
    lim = next((p.get("admission_limit") for p in pts if p.get("admission_limit")), None)
    return int(lim) if lim else None


def table(d: ReportData) -> pd.DataFrame:
    """Per arm: w, the instability and "full" rates, the model's knee, the measured bracket, and the
    largest TPOT error at the arm's calm rates.  Empty without a fit or both arms."""
    if d.coef is None or d.head.empty:
        return pd.DataFrame()
    req = counted(d.study.requests)
    arms = [m for m in d.arms if m in set(req["mode"]) and f"{m}_mean_tpot_ms" in d.head]
    workload = {m: (g["prompt_tokens"].mean(), g["num_cached_tokens"].mean(), g["output_tokens"].mean())
                for m, g in req[req["mode"].isin(arms)].groupby("mode")}
    if not workload:
        return pd.DataFrame()
    c = closure(d.coef, d.head, workload, limit(d))
    rows = []
    for arm, g in c.groupby("mode", sort=False):
        calm = g[g["saturated_share"] == 0]
        err = (calm["tpot_ms_model"] / calm["tpot_ms_measured"] - 1).abs()
        worst = calm.loc[err.idxmax()] if len(calm) else None
        b = knee_bracket(d.head, arm)
        rows.append({
            "arm": arm_label(arm), "work per request (ms)": f"{g['work_ms'].iloc[0]:.1f}",
            "unstable at (req/s)": f"{g['unstable_rate'].iloc[0]:.1f}",
            "full at (req/s)": f"{g['full_rate'].iloc[0]:.1f}" if math.isfinite(g["full_rate"].iloc[0]) else "–",
            "model knee (req/s)": f"{g['knee_rate'].iloc[0]:.1f}",
            "measured knee (req/s)": (f"{b['lo']:.1f}–{b['hi']:.1f}" if math.isfinite(b["hi"]) else
                                      f"> {b['lo']:.1f}" if math.isfinite(b["lo"]) else "–"),
            "model in bracket": _inside(g["knee_rate"].iloc[0], b),
            "TPOT model / measured, worst calm rate": (
                f"{worst['tpot_ms_model']:.2f} / {worst['tpot_ms_measured']:.2f} ms at {worst['arrival_rate']:.1f} req/s "
                f"({100 * (worst['tpot_ms_model'] / worst['tpot_ms_measured'] - 1):+.0f} %)" if worst is not None else "–"),
        })
    return pd.DataFrame(rows)


def _inside(knee: float, b: dict) -> str:
    lo = b["lo"] if math.isfinite(b["lo"]) else 0.0
    hi = b["hi"] if math.isfinite(b["hi"]) else math.inf
    if lo <= knee <= hi:
        return "yes"
    return "no: below" if knee < lo else "no: above"


PHYSICS_TEXT = ("The fitted coefficients beside the least time the GPU's datasheet allows for their work "
                "(model.closure.physics): share = that floor / the coefficient, the part of it the GPU's work "
                "explains at peak; the rest is below-peak kernels, launch gaps and host work. A prefilling "
                "request brings no GPU work beyond its tokens: its coefficient is host or launch overhead.")


def physics_table(d: ReportData) -> pd.DataFrame:
    """``model.closure.physics`` for the study's model and GPU; empty when either is unknown."""
    from prefixstudy.configs import recorded_model_dir
    from prefixstudy.model.arch import load_arch
    from prefixstudy.model.closure import physics
    from prefixstudy.model.gpus import find_gpu

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
