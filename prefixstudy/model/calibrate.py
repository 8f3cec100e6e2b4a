"""Stage: model.  The roofline against a measured study: fitted efficiencies, per-point errors.

* ``deployment_from_study``: the model, GPU, TP and dtype a study ran on.
* ``calibrate``: mfu, bw_eff and the per-step overhead fitted to its unsaturated points
  (``costmodel.roofline_fit``).
* ``model_vs_measurement``: measured vs predicted prefill, decode step and E2E per point
  (the report's "Model vs measurement" section).
* ``run_calibrate``: all of it for a results folder, with the figure and the text that
  ``prefixstudy model --calibrate`` prints.

pandas here; matplotlib only inside ``plot_calibration``.
"""

from __future__ import annotations

import math
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from prefixstudy.config import parse_config
from prefixstudy.errors import UserError
from prefixstudy.model.closure import admission_limit, arm_summary, closure, fitted_coef, study_workload
from prefixstudy.costmodel.arch import DTYPE_BYTES, arch_from_config, load_config_json
from prefixstudy.costmodel.gpus import GPU, find_gpu, load_gpus
from prefixstudy.costmodel.roofline import PEAK, Deployment, Efficiency, predict_request
from prefixstudy.costmodel.roofline_fit import Fit, decode_steps, fit_efficiency
from prefixstudy.results import load
from prefixstudy.metrics.requests import counted

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def deployment_from_study(config: dict[str, Any], device_name: str, gpus: dict[str, GPU] | None = None,
                          eff: Efficiency = PEAK) -> Deployment | None:
    """The deployment a study ran on, or None when its device is not in the GPU table."""
    gpu = find_gpu(device_name or "", gpus if gpus is not None else load_gpus())
    if gpu is None:
        return None
    cfg = parse_config(config, "config.yaml")
    cfg_json = load_config_json(Path(cfg.model))
    arch = arch_from_config(cfg_json, str(Path(cfg.model) / "config.json"))
    dtype = cfg.engine.dtype if cfg.engine.dtype != "auto" else str(cfg_json.get("torch_dtype", "bfloat16"))
    if dtype not in DTYPE_BYTES:
        raise UserError(f"config.yaml: field 'engine.dtype': unknown dtype {dtype!r}")
    return Deployment(arch, gpu, cfg.engine.tensor_parallel_size, DTYPE_BYTES[dtype], eff)


def _unsaturated(summary: pd.DataFrame) -> list[tuple[str, float]]:
    sat = summary["saturated"].astype(str).str.lower().isin(["true", "1"])
    rows = summary[~sat]
    return sorted({(str(m), float(r)) for m, r in zip(rows["mode"], rows["rate"], strict=True)})


def calibrate(summary: pd.DataFrame, requests: pd.DataFrame, iterations: pd.DataFrame,
              dep: Deployment, min_spread: float = 0.02) -> Fit:
    """The roofline's efficiencies fitted to a study's unsaturated points
    (``costmodel.roofline_fit.fit_efficiency``)."""
    points = _unsaturated(summary)
    if not points:
        raise UserError("summary.csv: no unsaturated point (column 'saturated' is True everywhere)")
    ok = counted(requests)
    if ok.empty:
        raise UserError("requests.parquet: no measured request without an error")
    return fit_efficiency(points, ok, iterations, dep, min_spread)


# --------------------------------------------------------------------------- model vs measurement

def _point_rows(dep: Deployment, mode: str, rate: float, arrival_rate: float, req: pd.DataFrame,
                its: pd.DataFrame) -> list[dict]:
    """Measured vs predicted prefill, decode step and E2E of one point.

    The decode step is the roofline's step at the point's mean decode batch, stretched by the prefills
    that share the engine with it: requests arriving at λ per second each bring P ms of prefill compute
    (their uncached tokens at ``mfu``), which leaves 1 − λ·P of every second to decode steps, so a
    running request's step lasts step(B) / (1 − λ·P) on average (``prefill_load`` = λ·P; at 1 or more
    the arm cannot keep up and the prediction is inf).  λ is the actual arrival rate.
    """
    batch = float(its["generation_tokens"].mean()) if len(its) else 1.0
    prompt, out = float(req["prompt_tokens"].mean()), float(req["output_tokens"].mean())
    p = predict_request(dep, prompt, float(req["num_cached_tokens"].mean()), out, batch)
    load = arrival_rate * p.prefill.compute_ms / 1e3
    step = p.decode_step.total_ms / (1 - load) if load < 1 else math.inf
    dec = req[req["output_tokens"] > 1]
    measured = {
        "prefill_ms": float(req["prefill_ms"].mean()),
        "decode_step_ms": float((dec["decode_ms"] / (dec["output_tokens"] - 1)).mean())
        if len(dec) else math.nan,
        "e2e_ms": float(req["e2e_ms"].mean()),
    }
    predicted = {"prefill_ms": p.prefill.total_ms, "decode_step_ms": step,
                 "e2e_ms": p.prefill.total_ms + max(out - 1, 0) * step}
    return [dict(mode=mode, rate=rate, quantity=q, batch=batch, prefill_load=load, measured_ms=measured[q],
                 predicted_ms=predicted[q], error_pct=(predicted[q] - measured[q]) / measured[q] * 100)
            for q in measured]


def _arrival_rates(summary: pd.DataFrame) -> dict[tuple[str, float], float]:
    """(mode, rate) -> the mean actual arrival rate over its repeats; 0 where the run did not record it."""
    if "arrival_rate" not in summary:
        return {}
    s = summary.assign(rate=summary["rate"].astype(float), mode=summary["mode"].astype(str))
    mean = pd.to_numeric(s["arrival_rate"], errors="coerce").groupby([s["mode"], s["rate"]]).mean()
    return {k: float(v) for k, v in mean.items() if math.isfinite(v)}


def model_vs_measurement(summary_df: pd.DataFrame, requests_df: pd.DataFrame,
                         iterations_df: pd.DataFrame, config_dict: dict[str, Any], device_name: str,
                         eff: Efficiency | None = None,
                         gpus: dict[str, GPU] | None = None) -> pd.DataFrame | None:
    """Measured vs predicted prefill, decode step and E2E per unsaturated point (``_point_rows``: the
    decode step carries the arriving prefills' share of the engine).

    None when ``device_name`` is not in the GPU table (e.g. "cpu").  Efficiencies are
    fitted to the same data (``calibrate``) unless ``eff`` is given; the fit is in
    ``df.attrs["fit"]``.  Long format: mode, rate, quantity, batch, prefill_load, measured_ms,
    predicted_ms, error_pct (predicted vs measured).  The model's config.json is read
    from the study config's ``model`` folder (relative to the working directory).
    """
    dep = deployment_from_study(config_dict, device_name, gpus)
    if dep is None:
        return None
    if eff is None:
        fit = calibrate(summary_df, requests_df, iterations_df, dep)
        eff = fit.eff
        fit_attrs = {**asdict(fit), "eff": asdict(fit.eff)}
    else:
        fit_attrs = {"eff": asdict(eff), "notes": ["efficiencies given, not fitted"]}
    dep = dep.with_eff(eff)
    points = _unsaturated(summary_df)
    ok = counted(requests_df)
    steps = decode_steps(iterations_df, points)
    arrival = _arrival_rates(summary_df)
    rows = []
    for mode, rate in points:
        req = ok[(ok["mode"] == mode) & (ok["rate"].astype(float) == rate)]
        if not req.empty:
            its = steps[(steps["mode"] == mode) & (steps["rate"].astype(float) == rate)]
            rows += _point_rows(dep, mode, rate, arrival.get((mode, rate), 0.0), req, its)
    df = pd.DataFrame(rows, columns=["mode", "rate", "quantity", "batch", "prefill_load", "measured_ms",
                                     "predicted_ms", "error_pct"])
    df.attrs["fit"] = fit_attrs
    df.attrs["deployment"] = f"{dep.arch.name} on {dep.tp} x {dep.gpu.name}"
    return df


# --------------------------------------------------------------------------- figure and text

def plot_calibration(df: pd.DataFrame) -> "Figure":
    """One panel per quantity: measured (markers) and predicted (lines) vs rate, ON and OFF."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    quantities = ["prefill_ms", "decode_step_ms", "e2e_ms"]
    fig = Figure(figsize=(12, 3.6), layout="constrained")
    axes = fig.subplots(1, len(quantities))
    colors = {"on": "tab:blue", "off": "tab:orange"}
    for ax, q in zip(axes, quantities, strict=True):
        for mode, unsorted in df[df["quantity"] == q].groupby("mode"):
            grp = unsorted.sort_values("rate")
            c = colors.get(str(mode), "tab:gray")
            ax.plot(grp["rate"], grp["measured_ms"], "o", color=c, label=f"{mode} measured")
            ax.plot(grp["rate"], grp["predicted_ms"], "-", color=c, label=f"{mode} model")
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("offered rate (req/s)")
        ax.set_ylabel(q.replace("_ms", " (ms)"))
        ax.set_title(q.replace("_ms", ""))
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"model vs measurement: {df.attrs.get('deployment', '')}")
    return fig


def render_calibration(fit: Fit, df: pd.DataFrame) -> str:
    """The fitted efficiencies, their notes, and the per-point table."""
    e = fit.eff
    L = [f"model vs measurement: {df.attrs.get('deployment', '')}",
         f"fitted: mfu {e.mfu:.4f}{'' if fit.mfu_fitted else ' (not fitted)'} from prefill at "
         f"{fit.prefill_point}; bw_eff {e.bw_eff:.4f}, overhead {e.overhead_ms:.4f} ms/step"
         f"{'' if fit.overhead_fitted else ' (held)'} from {fit.decode_steps} decode steps at "
         f"{fit.decode_points} batch size(s); all-reduce latency {e.allreduce_latency_us:g} us (given)"]
    L += [f"note: {n}" for n in fit.notes]
    L.append("decode step: the roofline's at the point's batch / (1 - load), load = arrival rate x the "
             "prefill compute each request brings")
    L.append(f"{'mode':<5} {'rate':>7} {'quantity':<15} {'batch':>6} {'load':>6} {'measured':>10} {'model':>10} "
             f"{'error':>8}")
    for r in df.itertuples():
        L.append(f"{r.mode:<5} {r.rate:>7g} {r.quantity:<15} {r.batch:>6.2f} {r.prefill_load:>6.3f} "
                 f"{r.measured_ms:>10.3f} {r.predicted_ms:>10.3f} {r.error_pct:>7.1f}%")
    return "\n".join(L)


def _pct(model: float, measured: float) -> str:
    return f"{100 * (model / measured - 1):.1f}%" if math.isfinite(model) and measured > 0 else "-"


def render_closure(arms: pd.DataFrame, points: pd.DataFrame) -> str:
    """``model.closure`` from the run's own step-cost fit: each arm's knee beside the measured bracket,
    and mean TPOT per rate."""
    L = ["from the step-cost fit: TPOT = a / (1 - rate x w), w the engine ms one request brings; the knee is "
         "where that diverges or the requests in the engine reach 80 % of max_num_seqs",
         f"{'arm':<5} {'w ms':>7} {'unstable':>9} {'full':>8} {'knee':>8} {'measured knee':>15}  in bracket"]
    for r in arms.itertuples():
        measured = (f"{r.knee_lo:.1f}-{r.knee_hi:.1f}" if math.isfinite(r.knee_hi) else
                    f"> {r.knee_lo:.1f}" if math.isfinite(r.knee_lo) else "-")
        L.append(f"{r.arm:<5} {r.work_ms:>7.1f} {r.unstable_rate:>9.1f} {r.full_rate:>8.1f} {r.knee_rate:>8.1f} "
                 f"{measured:>15}  {r.inside}")
    L.append(f"{'arm':<5} {'arrival':>7} {'saturated':>9} {'TPOT measured':>14} {'model':>8} {'error':>8}")
    for r in points.sort_values(["mode", "arrival_rate"]).itertuples():
        L.append(f"{r.mode:<5} {r.arrival_rate:>7.1f} {r.saturated_share:>9.2f} {r.tpot_ms_measured:>14.2f} "
                 f"{r.tpot_ms_model:>8.2f} {_pct(r.tpot_ms_model, r.tpot_ms_measured):>8}")
    return "\n".join(L)


def run_calibrate(results_dir: Path, gpus: dict[str, GPU], eff: Efficiency) -> str:
    """Fit a results folder, write plots/model_calibration.png, return the text to print.

    ``eff`` gives the overhead held when it cannot be fitted and the all-reduce latency.
    """
    res = load(results_dir)
    device = str(res.manifest.get("device", ""))
    dep = deployment_from_study(res.config, device, gpus, eff)
    if dep is None:
        raise UserError(f"{res.path / 'manifest.json'}: device {device!r} is not in the GPU table "
                        f"(add it with --gpus-file)")
    fit = calibrate(res.summary, res.requests, res.iterations, dep)
    df = model_vs_measurement(res.summary, res.requests, res.iterations, res.config, device,
                              eff=fit.eff, gpus=gpus)
    out = res.path / "plots" / "model_calibration.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    fig = plot_calibration(df)
    fig.savefig(out, dpi=120)
    text = render_calibration(fit, df)
    coef, head = fitted_coef(res.manifest), res.headline
    arms = [a for a in sorted(set(res.requests["mode"].astype(str))) if f"{a}_mean_tpot_ms" in head]
    workload = study_workload(counted(res.requests), arms)
    if coef is not None and not head.empty and workload:
        points = closure(coef, head, workload, admission_limit(res.manifest))
        text += "\n" + render_closure(arm_summary(points, head), points)
    return text + f"\nfigure: {out}"
