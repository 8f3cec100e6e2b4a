"""The simulator under cache pressure and on multi-turn sessions: every point of the committed H200
cache-pressure sweeps and the multi-turn study, simulated with the step cost fitted on all of
h200-tp1 (a different workload: 1214-token prompts, 8192-token steps), on each repeat's own arrival
schedule and with the run's own block count.

    PYTHONPATH=. python experiments/sim/pressure.py [--out experiments/results/sim-accuracy]

Writes pressure.csv (one row per point and repeat) and pressure.md (per point: measured and
simulated hit rate and mean E2E, means over repeats).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).parent))
from accuracy import simulate_points  # noqa: E402

from prefixstudy.costmodel.step_cost import fit, load_steps  # noqa: E402

RESULTS = Path("experiments/results")
CALIBRATION = RESULTS / "h200-tp1-sync"


def runs() -> list[tuple[str, Path]]:
    out = [(f"{d.parent.name}/{d.name}", d) for d in sorted((RESULTS / "h200-cache-pressure").glob("groups-*/blocks-*"),
                                                            key=lambda d: (d.parent.name, float(d.name.split("-")[1])))]
    # h200-multiturn ran with async scheduling on (vLLM's default), as did the cache-pressure sweeps;
    # h200-multiturn-sync is the same sessions one engine step at a time, as h200-tp1 (the fit) ran.
    return out + [("multiturn", RESULTS / "h200-multiturn"), ("multiturn-sync", RESULTS / "h200-multiturn-sync")]


def table(df: pd.DataFrame) -> str:
    """Per point, means over repeats: measured vs simulated hit rate, mean E2E, and the relative
    errors of mean and p90 E2E, TTFT and TPOT; the share of repeats saturated, measured / simulated."""
    g = df.groupby(["run", "mode", "rate"], sort=False)
    pp = g[[c for c in df.columns if c.endswith(("_meas", "_sim")) and not c.startswith("saturated")]].mean()
    pp["hit_err"] = pp["hit_rate_measured_sim"] - pp["hit_rate_measured_meas"]
    for k in ("mean_e2e_ms", "p90_e2e_ms", "mean_ttft_ms", "mean_tpot_ms"):
        pp[f"{k}_err"] = pp[f"{k}_sim"] / pp[f"{k}_meas"] - 1
    pp["sat_meas"], pp["sat_sim"] = g["saturated_meas"].mean(), g["saturated_sim"].mean()
    lines = ["| run | mode | rate | hit meas | hit sim | hit err | E2E meas ms | E2E sim ms | E2E err | p90 E2E err | "
             "TTFT err | TPOT err | saturated meas / sim |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for (run, mode, rate), r in pp.iterrows():
        lines.append(f"| {run} | {mode} | {rate:g} | {r.hit_rate_measured_meas:.3f} | {r.hit_rate_measured_sim:.3f} | "
                     f"{r.hit_err:+.3f} | {r.mean_e2e_ms_meas:.0f} | {r.mean_e2e_ms_sim:.0f} | {r.mean_e2e_ms_err:+.1%} | "
                     f"{r.p90_e2e_ms_err:+.1%} | {r.mean_ttft_ms_err:+.1%} | {r.mean_tpot_ms_err:+.1%} | "
                     f"{r.sat_meas:.0%} / {r.sat_sim:.0%} |")
    on = pp.xs("on", level="mode")
    calm = pp[(pp["sat_meas"] == 0) & (pp["sat_sim"] == 0)]
    agree = (pp["sat_meas"].round() == pp["sat_sim"].round()).sum()
    lines += ["", f"- Hit rate: {len(on)} ON points; worst error {on['hit_err'].abs().max():.3f}; "
              f"within 0.05 at {(on['hit_err'].abs() <= 0.05).sum()} of {len(on)}.",
              f"- Mean E2E where neither measurement nor simulation saturated ({len(calm)} points): within 5 % at "
              f"{(calm['mean_e2e_ms_err'].abs() <= 0.05).sum()}, within 10 % at {(calm['mean_e2e_ms_err'].abs() <= 0.10).sum()}; "
              f"worst {calm['mean_e2e_ms_err'].abs().max():.1%}.",
              f"- Saturated by the majority of repeats, measured and simulated agree at {agree} of {len(pp)} points."]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=RESULTS / "sim-accuracy")
    a = ap.parse_args()
    cost = fit(load_steps(CALIBRATION), source=str(CALIBRATION))
    rows = []
    for name, d in runs():
        rows += [{"run": name, **r} for r in simulate_points(d, lambda mode, rate: cost, "h200-tp1 fit")]
    df = pd.DataFrame(rows)
    a.out.mkdir(parents=True, exist_ok=True)
    df.to_csv(a.out / "pressure.csv", index=False)
    (a.out / "pressure.md").write_text(table(df))
    print(f"wrote {a.out}/pressure.csv, pressure.md", file=sys.stderr)


if __name__ == "__main__":
    main()
