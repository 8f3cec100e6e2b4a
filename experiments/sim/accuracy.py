"""The simulator's accuracy on the committed GPU studies, every point held out.

    PYTHONPATH=. python experiments/sim/accuracy.py [--out experiments/results/sim-accuracy]

For each study and each point (mode, rate): fit the step cost on the study's OTHER points (every
repeat of this one left out), simulate each repeat of the point with vLLM's scheduler on that
repeat's own arrival schedule (seed + repeat, as the runner drew it), compare with the measurement.
Then the transfer check: fit on all of TP 1, carry it to TP 2 with the roofline (and back), simulate
every point of the other study; and the same from TP 1 run through Ray's executor (h200-tp1-ray) to
TP 2.  Writes accuracy.csv (one row per point, repeat and check),
accuracy.md (per point: the means over repeats, the measured repeats' range, and the errors) and
summary.md (the table in docs/simulator.md: counts within 5 / 10 %, knees, hit rates).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from prefixstudy.config import load_config
from prefixstudy.shared.bootstrap import t_quantile
from prefixstudy.metrics.summary import summarize_point
from prefixstudy.results import read_summary
from prefixstudy.costmodel.arch import load_arch
from prefixstudy.costmodel.roofline import Deployment
from prefixstudy.costmodel.step_cost import fit, load_steps, step_error
from prefixstudy.costmodel.transfer import transfer
from prefixstudy.study.simulate import calibration_hardware, mean_context_tokens
from prefixstudy.sim.sessions import DEFAULT_BLOCK_SIZE, SimSession, SimTarget, block_count
from prefixstudy.sim.vllm_setup import vllm_config
from prefixstudy.sim.sessions import scheduler_spec
from prefixstudy.workloads import load_rows

STUDIES = {"h200-tp1": Path("experiments/results/h200-tp1-sync"), "h200-tp2": Path("experiments/results/h200-tp2"),
           "h200-tp1-ray": Path("experiments/results/h200-tp1-ray")}
# (source, target): TP 1 in process -> TP 2 through Ray and back; TP 1 through Ray -> TP 2 through Ray
# (the same executor at both degrees, so what is left of the error is the degree's).
TRANSFERS = (("h200-tp1", "h200-tp2"), ("h200-tp2", "h200-tp1"), ("h200-tp1-ray", "h200-tp2"))
METRICS = ("mean_e2e_ms", "p90_e2e_ms", "mean_ttft_ms", "mean_tpot_ms", "hit_rate_measured", "saturated")


def simulate_points(study_dir: Path, cost_for_point, check: str, repeats=None, points=None) -> list[dict]:
    """Simulate every measured (mode, rate, repeat) of ``study_dir`` (only ``repeats`` and only the
    (mode, rate) ``points`` where given); ``cost_for_point(mode, rate)`` prices it."""
    cfg = load_config(study_dir / "config.yaml")
    rows = load_rows(cfg)
    gpu, tp, _ = calibration_hardware(study_dir)
    arch = load_arch(cfg.model)
    measured = read_summary(study_dir / "summary.csv")
    if repeats is not None:
        measured = measured[measured["repeat"].isin(repeats)]
    if points is not None:
        measured = measured[[(m, float(r)) in points for m, r in zip(measured["mode"], measured["rate"], strict=True)]]
    base = SimTarget(gpu.name, tp, block_count(cfg, arch, gpu, tp, DEFAULT_BLOCK_SIZE), DEFAULT_BLOCK_SIZE,
                     cost_for_point("on", measured.rate.iloc[0]))
    vc = vllm_config(scheduler_spec(cfg, base, "on"))
    out = []
    for (mode, rate), pts in measured.groupby(["mode", "rate"], sort=False):
        target = SimTarget(base.gpu, tp, base.num_gpu_blocks, base.block_size, cost_for_point(mode, rate))
        session = SimSession(cfg, mode, rows, target, vc)
        for _, m in pts.iterrows():
            t = time.perf_counter()
            res = session.run_point(float(rate), int(m["repeat"]))
            row = summarize_point(res.requests, {"mode": mode, "rate": rate, **res.meta},
                                  cfg.checks.hit_rate_tolerance, res.iterations)
            out.append({"study": study_dir.name, "check": check, "mode": mode, "rate": rate, "repeat": int(m["repeat"]),
                        "sim_wall_s": time.perf_counter() - t, "n_requests": res.meta["n_sent"],
                        **{f"{k}_meas": m[k] for k in METRICS}, **{f"{k}_sim": row[k] for k in METRICS}})
            print(f"{check} {study_dir.name} {mode} {rate:g} r{int(m['repeat'])}: e2e {row['mean_e2e_ms']:.0f} vs "
                  f"{m['mean_e2e_ms']:.0f} ms", file=sys.stderr)
    return out


def held_out(study_dir: Path) -> list[dict]:
    steps = load_steps(study_dir)  # every repeat of the point is left out of its fit

    def cost(mode, rate):
        return fit(steps[(steps["mode"] != mode) | (steps["rate"] != rate)], source=f"{study_dir} without {mode} {rate:g}")

    return simulate_points(study_dir, cost, "held-out point")


def transfer_model(src_dir: Path, dst_dir: Path):
    """The fit on all of ``src_dir``'s steps, moved to ``dst_dir``'s GPU and TP degree."""
    cfg = load_config(dst_dir / "config.yaml")
    arch = load_arch(cfg.model)
    src = Deployment(arch, *calibration_hardware(src_dir)[:2])
    dst = Deployment(arch, *calibration_hardware(dst_dir)[:2])
    return transfer(fit(load_steps(src_dir), source=str(src_dir)), src, dst, mean_context_tokens(load_rows(cfg)))


def transferred(src_dir: Path, dst_dir: Path) -> list[dict]:
    model = transfer_model(src_dir, dst_dir)
    return simulate_points(dst_dir, lambda mode, rate: model, f"transfer from {src_dir.name}")


def add_cost_error(df: pd.DataFrame) -> pd.DataFrame:
    """Split each point's error: ``cost_busy_err`` is the cost model's error on the busy time of the
    steps the real engine ran at that point and repeat (the cost model alone, the real schedule); what
    is left of the E2E error comes from the schedule the simulator produced (queueing, batching) and
    from latency outside the engine steps."""
    out = []
    fits, steps_of = {}, {}
    for _, r in df.iterrows():
        d = STUDIES[r["study"]]
        steps = steps_of.setdefault(r["study"], load_steps(d))
        at = steps[(steps["mode"] == r["mode"]) & (steps["rate"] == r["rate"]) & (steps["repeat"] == r["repeat"])]
        if r["check"] == "held-out point":
            key = (r["study"], r["mode"], r["rate"])
            if key not in fits:
                fits[key] = fit(steps[(steps["mode"] != r["mode"]) | (steps["rate"] != r["rate"])])
        else:
            key = r["check"]
            if key not in fits:
                src = STUDIES[r["check"].removeprefix("transfer from ")]
                cfg = load_config(d / "config.yaml")
                arch = load_arch(cfg.model)
                fits[key] = transfer(fit(load_steps(src)), Deployment(arch, *calibration_hardware(src)[:2]),
                                     Deployment(arch, *calibration_hardware(d)[:2]),
                                     mean_context_tokens(load_rows(cfg)))
        out.append(step_error(fits[key], at)["total_rel_err"])
    return df.assign(cost_busy_err=out)


def per_point(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (check, study, mode, rate): means over repeats, the measured repeats' range, the
    share of repeats saturated (measured and simulated), and the relative errors of the means."""
    keys = ["check", "study", "mode", "rate"]
    g = df.groupby(keys, sort=False)
    out = g[[f"{k}_{w}" for k in METRICS[:-1] for w in ("meas", "sim")] + ["cost_busy_err"]].mean()
    out["n_repeats"] = g.size()
    out["e2e_meas_min"], out["e2e_meas_max"] = g["mean_e2e_ms_meas"].min(), g["mean_e2e_ms_meas"].max()
    out["saturated_meas_share"] = g["saturated_meas"].mean()
    out["saturated_sim_share"] = g["saturated_sim"].mean()
    for k in ("mean_e2e_ms", "p90_e2e_ms", "mean_ttft_ms", "mean_tpot_ms"):
        out[f"{k}_err"] = out[f"{k}_sim"] / out[f"{k}_meas"] - 1
    out["within_spread"] = (out["mean_e2e_ms_sim"] >= out["e2e_meas_min"]) & (out["mean_e2e_ms_sim"] <= out["e2e_meas_max"])
    return out.reset_index()


def measured_half_width(df: pd.DataFrame) -> pd.DataFrame:
    """Per (check, study, mode, rate): the 95 % t-interval's half-width of the measured mean E2E over
    the point's repeats, relative to that mean (``e2e_meas_ci``; inf with one repeat): how closely
    the repeats pin the mean that a prediction is compared with."""
    def half(x: pd.Series) -> float:
        n = len(x)
        return t_quantile(0.975, n - 1) * x.std(ddof=1) / np.sqrt(n) / x.mean() if n > 1 else np.inf

    keys = ["check", "study", "mode", "rate"]
    return df.groupby(keys, sort=False)["mean_e2e_ms_meas"].apply(half).rename("e2e_meas_ci").reset_index()


def verified(err: pd.Series, ci: pd.Series, tolerance: float) -> tuple[int, int, int]:
    """Over points with relative errors ``err`` and measured-mean half-widths ``ci``
    (``measured_half_width``): how many the repeats pin to within ``tolerance``, at how many of those
    the prediction is within ``tolerance``, and at how many points it is within ``tolerance`` or
    inside the measured mean's interval."""
    e, known = err.abs(), ci <= tolerance
    return int(known.sum()), int((known & (e <= tolerance)).sum()), int(((e <= tolerance) | (e <= ci)).sum())


def repeats_to_pin(values, tolerance: float = 0.05) -> int:
    """How many repeats would pin a point's measured mean to within ``tolerance`` of it (the 95 %
    t-interval's half-width), at the spread these repeats show: the least n with
    t(0.975, n - 1) * sd / sqrt(n) <= tolerance * mean."""
    x = np.asarray(values, float)
    cv = x.std(ddof=1) / x.mean()
    n = 2
    while t_quantile(0.975, n - 1) * cv / np.sqrt(n) > tolerance:
        n += 1
    return n


def _pct(x: float) -> str:
    return f"{x * 100:+.1f} %"


def table(pp: pd.DataFrame) -> str:
    """Markdown: predicted vs measured per point (means over repeats), relative errors."""
    lines = ["| check | study | mode | rate | repeats | E2E mean sim / meas (ms) | measured range | err | E2E p90 err "
             "| TTFT mean sim / meas (ms) | TPOT err | hit rate sim / meas | saturated sim / meas | cost model's busy-time err |",
             "|" + "---|" * 14]
    for _, r in pp.iterrows():
        lines.append(f"| {r['check']} | {r['study']} | {r['mode']} | {r['rate']:g} | {r['n_repeats']} | "
                     f"{r['mean_e2e_ms_sim']:.0f} / {r['mean_e2e_ms_meas']:.0f} | "
                     f"{r['e2e_meas_min']:.0f}–{r['e2e_meas_max']:.0f} | "
                     f"{_pct(r['mean_e2e_ms_err'])} | {_pct(r['p90_e2e_ms_err'])} | "
                     f"{r['mean_ttft_ms_sim']:.1f} / {r['mean_ttft_ms_meas']:.1f} | {_pct(r['mean_tpot_ms_err'])} | "
                     f"{r['hit_rate_measured_sim']:.3f} / {r['hit_rate_measured_meas']:.3f} | "
                     f"{r['saturated_sim_share']:.0%} / {r['saturated_meas_share']:.0%} | {_pct(r['cost_busy_err'])} |")
    return "\n".join(lines) + "\n"


def knee_step(pp: pd.DataFrame, mode: str) -> tuple[float, float]:
    """(measured, simulated) knee as in metrics.headline: the last rate where most repeats kept up,
    every lower rate too (nan if the lowest saturated; the top rate if none did)."""
    out = []
    for col in ("saturated_meas_share", "saturated_sim_share"):
        last = float("nan")
        for _, r in pp[pp["mode"] == mode].sort_values("rate").iterrows():
            if r[col] > 0.5:
                break
            last = float(r["rate"])
        out.append(last)
    return tuple(out)


def summary(pp: pd.DataFrame) -> str:
    """The table in docs/simulator.md: per check, over points most repeats of which kept up (as measured)."""
    lines = ["| check | unsaturated points | within 5 % | within 10 % | mean abs error | worst | within the repeats' range "
             "| knee ON meas / sim | knee OFF meas / sim | max hit-rate gap |", "|" + "---|" * 10]
    for (check, study), g in pp.groupby(["check", "study"], sort=False):
        u = g[g["saturated_meas_share"] <= 0.5]
        e = u["mean_e2e_ms_err"]
        w = u.loc[e.abs().idxmax()] if len(u) else None
        knees = [knee_step(g, m) for m in ("on", "off")]
        worst = f"{_pct(w['mean_e2e_ms_err'])} ({w['mode'].upper()} {w['rate']:g})" if w is not None else "-"
        name = f"{study}, point held out" if check == "held-out point" else f"{check} → {study}"
        lines.append(f"| {name} | {len(u)} | {(e.abs() <= 0.05).sum()} | {(e.abs() <= 0.10).sum()} | "
                     f"{e.abs().mean() * 100:.1f} % | {worst} | {int(u['within_spread'].sum())} | "
                     f"{knees[0][0]:g} / {knees[0][1]:g} | {knees[1][0]:g} / {knees[1][1]:g} | "
                     f"{(g['hit_rate_measured_sim'] - g['hit_rate_measured_meas']).abs().max():.3f} |")
    return "\n".join(lines) + "\n"


def write(df: pd.DataFrame, out: Path) -> None:
    df.to_csv(out / "accuracy.csv", index=False)
    pp = per_point(df)
    (out / "accuracy.md").write_text(table(pp))
    (out / "summary.md").write_text(summary(pp))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("experiments/results/sim-accuracy"))
    ap.add_argument("--checks", default="held-out,transfer")
    ap.add_argument("--tables-only", action="store_true", help="Only rewrite the tables from an existing accuracy.csv.")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    if a.tables_only:
        write(pd.read_csv(a.out / "accuracy.csv"), a.out)
        return
    rows = []
    if "held-out" in a.checks:
        for d in STUDIES.values():
            rows += held_out(d)
    if "transfer" in a.checks:
        for src, dst in TRANSFERS:
            rows += transferred(STUDIES[src], STUDIES[dst])
    write(add_cost_error(pd.DataFrame(rows)), a.out)
    print(f"wrote {a.out}/accuracy.csv, accuracy.md, summary.md", file=sys.stderr)


if __name__ == "__main__":
    main()
