"""docs/simulator.md's speed claims are benchmarks/results/simulate_speed.jsonl's lines."""

from __future__ import annotations

import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def _lines() -> list[dict]:
    return [json.loads(x) for x in (REPO / "benchmarks/results/simulate_speed.jsonl").read_text().splitlines() if x]


def test_the_default_engine_sentence_is_the_last_lines_side_by_side_run():
    last = _lines()[-1]
    assert last["baseline_commit"] == "the same checkout, --stepwise" and last["runs_each"] == 3
    assert "--calibration experiments/results/h200-tp1 " in last["command"]
    med = last["medians"]
    assert last["branch_vs_stepwise_differing"] == {"requests.parquet": [], "iterations.parquet": []}
    text = " ".join((REPO / "docs/simulator.md").read_text().split())
    assert (f"{med['branch']['sim_s']:.2f} s of points' own seconds against {med['stepwise']['sim_s']:.2f} s with "
            f"`--stepwise`, **{last['ratio_sim']:.2f}×**, results identical") in text
    assert (f"{med['branch']['points_phase_s']:.2f} s against {med['stepwise']['points_phase_s']:.2f} s "
            f"({last['ratio_points_phase']:.2f}×) and the whole command {med['branch']['wall_s']:.1f} s against "
            f"{med['stepwise']['wall_s']:.1f} s ({last['ratio_wall']:.2f}×)") in text
    assert f"the code at {last['branch_commit'].split()[0]} and only that file" in text


def test_the_lane_table_quotes_its_own_line():
    (line,) = [x for x in _lines() if x["measured_at"] == "2026-12-02T15:22Z"]
    text = " ".join((REPO / "docs/simulator.md").read_text().split())
    assert "the line measured at 2026-12-02T15:22Z" in text
    assert f"| {line['medians']['baseline']['sim_s']:.2f} s | {line['medians']['branch']['sim_s']:.2f} s | " \
           f"**{line['ratio_sim']:.2f}×** |" in text
