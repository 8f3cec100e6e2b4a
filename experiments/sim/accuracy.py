"""The simulator's accuracy on the committed GPU studies, every point held out.

    PYTHONPATH=. python experiments/sim/accuracy.py [--out experiments/results/sim-accuracy]

For each study and each point (mode, rate): fit the step cost on the study's OTHER points, simulate
that point with vLLM's scheduler, compare with the measurement.  Then the transfer check: fit on all
of TP 1, carry it to TP 2 with the roofline (and back), simulate every point of the other study.
Writes accuracy.csv (one row per point and check) and accuracy.md (the table for the README).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pandas as pd

from prefixstudy.config import load_config
from prefixstudy.metrics.summary import summarize_point
from prefixstudy.model.arch import load_arch
from prefixstudy.sim.cost import fit, load_steps, step_error
from prefixstudy.sim.hardware import transfer
from prefixstudy.sim.run import calibration_hardware, mean_context_tokens
from prefixstudy.sim.study import DEFAULT_BLOCK_SIZE, SimSession, SimTarget, block_count
from prefixstudy.sim.vllm_setup import vllm_config
from prefixstudy.sim.study import scheduler_spec
from prefixstudy.workloads import load_rows

STUDIES = {"h200-tp1": Path("experiments/results/h200-tp1"), "h200-tp2": Path("experiments/results/h200-tp2")}
METRICS = ("mean_e2e_ms", "p90_e2e_ms", "mean_ttft_ms", "mean_tpot_ms", "hit_rate_measured", "saturated")


def simulate_points(study_dir: Path, cost_for_point, check: str) -> list[dict]:
    """Simulate every measured point of ``study_dir``; ``cost_for_point(mode, rate)`` prices it."""
    cfg = load_config(study_dir / "config.yaml")
    rows = load_rows(cfg)
    gpu, tp, _ = calibration_hardware(study_dir)
    arch = load_arch(cfg.model)
    measured = pd.read_csv(study_dir / "summary.csv")
    base = SimTarget(gpu.name, tp, block_count(cfg, arch, gpu, tp, DEFAULT_BLOCK_SIZE), DEFAULT_BLOCK_SIZE,
                     cost_for_point("on", measured.rate.iloc[0]))
    vc = vllm_config(scheduler_spec(cfg, base, "on"))
    out = []
    for _, m in measured.iterrows():
        target = SimTarget(base.gpu, tp, base.num_gpu_blocks, base.block_size, cost_for_point(m["mode"], m["rate"]))
        t = time.perf_counter()
        res = SimSession(cfg, m["mode"], rows, target, vc).run_point(float(m["rate"]))
        row = summarize_point(res.requests, {"mode": m["mode"], "rate": m["rate"], **res.meta},
                              cfg.checks.hit_rate_tolerance, res.iterations)
        out.append({"study": study_dir.name, "check": check, "mode": m["mode"], "rate": m["rate"],
                    "sim_wall_s": time.perf_counter() - t, "n_requests": res.meta["n_sent"],
                    **{f"{k}_meas": m[k] for k in METRICS}, **{f"{k}_sim": row[k] for k in METRICS}})
        print(f"{check} {study_dir.name} {m['mode']} {m['rate']:g}: e2e {row['mean_e2e_ms']:.0f} vs "
              f"{m['mean_e2e_ms']:.0f} ms", file=sys.stderr)
    return out


def held_out(study_dir: Path) -> list[dict]:
    steps = load_steps(study_dir)

    def cost(mode, rate):
        return fit(steps[(steps["mode"] != mode) | (steps["rate"] != rate)], source=f"{study_dir} without {mode} {rate:g}")

    return simulate_points(study_dir, cost, "held-out point")


def transferred(src_dir: Path, dst_dir: Path) -> list[dict]:
    cfg = load_config(dst_dir / "config.yaml")
    arch = load_arch(cfg.model)
    src, dst = calibration_hardware(src_dir)[:2], calibration_hardware(dst_dir)[:2]
    model = transfer(fit(load_steps(src_dir), source=str(src_dir)), arch, src, dst, mean_context_tokens(load_rows(cfg)))
    return simulate_points(dst_dir, lambda mode, rate: model, f"transfer from {src_dir.name}")


def add_cost_error(df: pd.DataFrame) -> pd.DataFrame:
    """Split each point's error: ``cost_busy_err`` is the cost model's error on the busy time of the
    steps the real engine ran at that point (the cost model alone, the real schedule); what is left
    of the E2E error comes from the schedule the simulator produced (queueing, batching) and from
    latency outside the engine steps."""
    out = []
    fits = {}
    for _, r in df.iterrows():
        d = STUDIES[r["study"]]
        steps = load_steps(d)
        at = steps[(steps["mode"] == r["mode"]) & (steps["rate"] == r["rate"])]
        if r["check"] == "held-out point":
            model = fit(steps[(steps["mode"] != r["mode"]) | (steps["rate"] != r["rate"])])
        else:
            src = STUDIES[r["check"].removeprefix("transfer from ")]
            if r["check"] not in fits:
                cfg = load_config(d / "config.yaml")
                fits[r["check"]] = transfer(fit(load_steps(src)), load_arch(cfg.model), calibration_hardware(src)[:2],
                                            calibration_hardware(d)[:2], mean_context_tokens(load_rows(cfg)))
            model = fits[r["check"]]
        out.append(step_error(model, at)["total_rel_err"])
    return df.assign(cost_busy_err=out)


def table(df: pd.DataFrame) -> str:
    """Markdown: predicted vs measured per point, relative errors of the latencies."""
    lines = ["| check | study | mode | rate | E2E mean sim / meas (ms) | err | E2E p90 err | TTFT mean sim / meas (ms) "
             "| TPOT err | hit rate sim / meas | saturated sim / meas | cost model's busy-time err |", "|" + "---|" * 12]
    for _, r in df.iterrows():
        def err(k):
            return f"{(r[k + '_sim'] / r[k + '_meas'] - 1) * 100:+.1f} %"
        lines.append(f"| {r['check']} | {r['study']} | {r['mode']} | {r['rate']:g} | {r['mean_e2e_ms_sim']:.0f} / "
                     f"{r['mean_e2e_ms_meas']:.0f} | {err('mean_e2e_ms')} | {err('p90_e2e_ms')} | "
                     f"{r['mean_ttft_ms_sim']:.1f} / {r['mean_ttft_ms_meas']:.1f} | {err('mean_tpot_ms')} | "
                     f"{r['hit_rate_measured_sim']:.3f} / {r['hit_rate_measured_meas']:.3f} | "
                     f"{'yes' if r['saturated_sim'] else 'no'} / {'yes' if r['saturated_meas'] else 'no'} | "
                     f"{r['cost_busy_err'] * 100:+.1f} % |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("experiments/results/sim-accuracy"))
    ap.add_argument("--checks", default="held-out,transfer")
    ap.add_argument("--split-only", action="store_true", help="Only add cost_busy_err to an existing accuracy.csv.")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    if a.split_only:
        df = add_cost_error(pd.read_csv(a.out / "accuracy.csv"))
        df.to_csv(a.out / "accuracy.csv", index=False)
        (a.out / "accuracy.md").write_text(table(df))
        return
    rows = []
    if "held-out" in a.checks:
        for d in STUDIES.values():
            rows += held_out(d)
    if "transfer" in a.checks:
        rows += transferred(STUDIES["h200-tp1"], STUDIES["h200-tp2"]) + transferred(STUDIES["h200-tp2"], STUDIES["h200-tp1"])
    df = add_cost_error(pd.DataFrame(rows))
    df.to_csv(a.out / "accuracy.csv", index=False)
    (a.out / "accuracy.md").write_text(table(df))
    print(f"wrote {a.out}/accuracy.csv, accuracy.md", file=sys.stderr)


if __name__ == "__main__":
    main()
