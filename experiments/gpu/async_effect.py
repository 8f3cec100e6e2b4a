"""What vLLM's async scheduling changes, on the same GPU in one lease: mean E2E, TTFT and TPOT of
each mode at the rates both studies ran, async off (the measured study) against async on.

    python experiments/gpu/async_effect.py experiments/results/h200-tp1 experiments/results/h200-tp1-async

Means over the repeats' means (summary.csv); "change" is async off relative to async on.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

METRICS = ("mean_e2e_ms", "mean_ttft_ms", "mean_tpot_ms")


def async_effect(sync: pd.DataFrame, async_: pd.DataFrame) -> pd.DataFrame:
    key = ["mode", "rate"]
    a = async_[async_["status"] == "ok"].groupby(key)[list(METRICS)].mean()
    s = sync[sync["status"] == "ok"].groupby(key)[list(METRICS)].mean().reindex(a.index)
    out = pd.concat({"async_off": s, "async_on": a}, axis=1)
    for m in METRICS:
        out[("change_pct", m)] = 100 * (out[("async_off", m)] / out[("async_on", m)] - 1)
    gains = {}
    for name, d in (("async_off", s), ("async_on", a)):
        e = d["mean_e2e_ms"].unstack("mode")
        gains[name] = 100 * (1 - e["on"] / e["off"])
    out = out.round(2)
    return out, pd.DataFrame(gains).round(1)


if __name__ == "__main__":
    sync_dir, async_dir = (Path(p) for p in sys.argv[1:3])
    table, gains = async_effect(pd.read_csv(sync_dir / "summary.csv"), pd.read_csv(async_dir / "summary.csv"))
    pd.set_option("display.width", 200)
    print(table.to_string())
    print("\ncaching gain of mean E2E (%), by rate")
    print(gains.to_string())
