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

from prefixstudy.sim.cost import fit, load_steps  # noqa: E402

RESULTS = Path("experiments/results")
CALIBRATION = RESULTS / "h200-tp1"


def runs() -> list[tuple[str, Path]]:
    out = [(f"{d.parent.name}/{d.name}", d) for d in sorted((RESULTS / "h200-cache-pressure").glob("groups-*/blocks-*"),
                                                            key=lambda d: (d.parent.name, float(d.name.split("-")[1])))]
    return out + [("multiturn", RESULTS / "h200-multiturn")]


def table(df: pd.DataFrame) -> str:
    g = df.groupby(["run", "mode", "rate"], sort=False)
    pp = g[["hit_rate_measured_meas", "hit_rate_measured_sim", "mean_e2e_ms_meas", "mean_e2e_ms_sim"]].mean()
    pp["hit_err"] = pp["hit_rate_measured_sim"] - pp["hit_rate_measured_meas"]
    pp["e2e_err"] = pp["mean_e2e_ms_sim"] / pp["mean_e2e_ms_meas"] - 1
    pp["saturated_meas"] = g["saturated_meas"].mean()
    lines = ["| run | mode | rate | hit meas | hit sim | hit err | E2E meas ms | E2E sim ms | E2E err | saturated (meas) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for (run, mode, rate), r in pp.iterrows():
        lines.append(f"| {run} | {mode} | {rate:g} | {r.hit_rate_measured_meas:.3f} | {r.hit_rate_measured_sim:.3f} | "
                     f"{r.hit_err:+.3f} | {r.mean_e2e_ms_meas:.0f} | {r.mean_e2e_ms_sim:.0f} | {r.e2e_err:+.1%} | "
                     f"{r.saturated_meas:.0%} |")
    on = pp.xs("on", level="mode")
    lines += ["", f"ON points: {len(on)}; worst hit-rate error {on['hit_err'].abs().max():.3f}; "
              f"within 0.05 at {(on['hit_err'].abs() <= 0.05).sum()} of {len(on)}."]
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
