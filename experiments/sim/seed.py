"""The seed's answer from a simulated run: E2E curves with error bars, prefill share, knees and
throughput at latency thresholds.

    PYTHONPATH=. python experiments/sim/seed.py SIM_RUN_DIR [--accuracy experiments/results/sim-accuracy/accuracy.csv]

The error bar of a point is the |relative mean-E2E error| of the TP 1 -> TP 2 transfer check at the
same mode and the nearest measured rate (mean over repeats): the measured error of carrying a fit to a
higher TP degree than it was fitted on, the seed's direction.  It grows with load, and with the
distance between degrees, so for TP 8 it is a lower bound.  Writes seed.md into SIM_RUN_DIR.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import pandas as pd

from prefixstudy.metrics.summary import knee_rate, max_rate_meeting

THRESHOLDS_MS = (500, 1000, 2000)


def transfer_band(acc: pd.DataFrame, check: str = "transfer from h200-tp1"):
    """band(mode, rate) -> relative error bar (see the module doc); ``band.direction`` says which
    way the transfer missed (high, low or both) over the points the bars come from."""
    t = acc[acc["check"] == check].groupby(["mode", "rate"])[["mean_e2e_ms_sim", "mean_e2e_ms_meas"]].mean()
    t = t.assign(signed=t["mean_e2e_ms_sim"] / t["mean_e2e_ms_meas"] - 1).reset_index()
    t = t.assign(err=t["signed"].abs())

    def band(mode: str, rate: float) -> float:
        m = t[t["mode"] == mode]
        nearest = m.loc[(m["rate"] - rate).abs() == (m["rate"] - rate).abs().min()]
        return float(nearest["err"].max())

    band.direction = ("high at every point" if (t["signed"] > 0).all() else
                      "low at every point" if (t["signed"] < 0).all() else "high at some points and low at others")
    return band


def report(run: Path, band) -> str:
    s = pd.read_csv(run / "summary.csv")
    lines = [f"Simulated: {run}. Error bars: the TP 1 -> TP 2 transfer error at the same mode and nearest rate "
             f"(a lower bound for TP 8, not a bound: that transfer predicted {band.direction}).",
             "", "| rate | ON mean E2E (ms) | OFF mean E2E (ms) | saved | ON / OFF prefill share | ON / OFF saturated |",
             "|---|---|---|---|---|---|"]
    on, off = s[s["mode"] == "on"].set_index("rate"), s[s["mode"] == "off"].set_index("rate")
    for r in on.index.intersection(off.index):
        a, b = on.loc[r], off.loc[r]
        lines.append(f"| {r:g} | {a.mean_e2e_ms:.1f} ± {a.mean_e2e_ms * band('on', r):.1f} | {b.mean_e2e_ms:.1f} ± "
                     f"{b.mean_e2e_ms * band('off', r):.1f} | {(1 - a.mean_e2e_ms / b.mean_e2e_ms) * 100:.1f} % | "
                     f"{a.prefill_share:.3f} / {b.prefill_share:.3f} | {bool(a.saturated)} / {bool(b.saturated)} |")
    def knee(mode: str) -> str:
        m = s[s["mode"] == mode]
        return f"{knee_rate(s, mode):g} req/s" if m["saturated"].any() else f"none (not saturated up to {m['rate'].max():g})"

    lines += ["", f"Knee (highest rate before the first saturated one): ON {knee('on')}, OFF {knee('off')}.", "",
              "| mean E2E threshold (ms) | ON max rate | OFF max rate |", "|---|---|---|"]
    def best(t: float, mode: str) -> str:
        r = max_rate_meeting(s, "mean_e2e_ms", t, mode)
        return "none" if math.isnan(r) else f"{r:g}"  # nan: no rate meets it

    for t in THRESHOLDS_MS:
        lines.append(f"| {t} | {best(t, 'on')} | {best(t, 'off')} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("run", type=Path)
    ap.add_argument("--accuracy", type=Path, default=Path("experiments/results/sim-accuracy/accuracy.csv"))
    a = ap.parse_args()
    text = report(a.run, transfer_band(pd.read_csv(a.accuracy)))
    (a.run / "seed.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
