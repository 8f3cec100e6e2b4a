"""report.gain_split's table: each part with its interval, in whole points where the two measures
differ by a point or more, at the interval's precision where they agree."""

from __future__ import annotations

import pandas as pd

from prefixstudy.metrics.gain_split import PARTS
from prefixstudy.report import gain_split as split_report


def _row(measure: str, stalls: float, decode: float, broken: int = 0) -> dict:
    row = {"rate": 16.0, "measure": measure, "gain": 0.424, "gain_lo": 0.396, "gain_hi": 0.452, "broken_series": broken}
    for p in PARTS:
        v = {"prefill_stalls": stalls, "decode_steps": decode}.get(p, 0.028 if p == "own_prefill" else 0.0)
        row |= {f"{p}_points": v, f"{p}_points_lo": v - 0.004, f"{p}_points_hi": v + 0.004}
    return row


def test_parts_the_measures_disagree_on_are_whole_points_the_rest_keep_their_intervals_precision():
    c = split_report.cells(pd.DataFrame([_row("fitted", 0.395, 0.003), _row("model-free", 0.330, 0.067, broken=1)]))
    c = c.set_index("measure")
    assert c.loc["fitted", ["prefill_stalls", "decode_steps"]].tolist() == ["40 [39, 40]", "0 [0, 1]"]
    assert c.loc["model-free", ["prefill_stalls", "decode_steps"]].tolist() == ["33 [33, 33]", "7 [6, 7]"]
    assert c.loc["fitted", "own_prefill"] == c.loc["model-free", "own_prefill"] == "2.8 [2.4, 3.2]"
    assert c.loc["model-free", "unpriced"].endswith("(1 runs' mixed steps shorter than decode-only)")
    assert c.loc["fitted", "gain"] == "42 [40, 45]"
