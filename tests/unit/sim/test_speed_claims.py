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
    pairs = [a["sim_s"] / b["sim_s"] for a, b in zip(last["runs"]["stepwise"], last["runs"]["branch"], strict=True)]
    assert f"each interleaved pair of runs gives {min(pairs):.2f}–{max(pairs):.2f}×" in text


def test_the_lane_table_quotes_its_own_line():
    (line,) = [x for x in _lines() if x["measured_at"] == "2026-12-02T15:22Z"]
    text = " ".join((REPO / "docs/simulator.md").read_text().split())
    assert "the line measured at 2026-12-02T15:22Z" in text
    assert f"| {line['medians']['baseline']['sim_s']:.2f} s | {line['medians']['branch']['sim_s']:.2f} s | " \
           f"**{line['ratio_sim']:.2f}×** |" in text


def test_the_frozen_heap_sentence_quotes_its_own_line():
    (line,) = [x for x in _lines() if x["measured_at"] == "2026-12-05T02:07Z"]
    assert (line["baseline_commit"], line["branch_commit"], line["runs_each"]) == ("592b6b8", "df02895", 3)
    assert line["branch_vs_baseline_differing"] == {"requests.parquet": [], "iterations.parquet": []}
    base, branch = line["medians"]["baseline"], line["medians"]["branch"]

    def span(arm: str, key: str) -> tuple[float, float]:
        values = [r[key] for r in line["runs"][arm]]
        return min(values), max(values)

    (b0, b1), (r0, r1) = span("baseline", "points_phase_s"), span("branch", "points_phase_s")
    assert r1 < b0  # the phase: every run of the branch below every run of the baseline
    text = " ".join((REPO / "docs/simulator.md").read_text().split())
    assert (f"the line measured at 2026-12-05T02:07Z, 592b6b8 against df02895, the seed command with its report, 3 "
            f"interleaved runs each, medians): the points' phase {base['points_phase_s']:.2f} s against "
            f"{branch['points_phase_s']:.2f} s ({line['ratio_points_phase']:.2f}×; the runs span {b0:.2f}–{b1:.2f} s "
            f"and {r0:.2f}–{r1:.2f} s), results identical") in text
    # "moved less than their runs spread": the medians' change is below either arm's max - min
    for key in ("sim_s", "wall_s"):
        spreads = [hi - lo for lo, hi in (span("baseline", key), span("branch", key))]
        assert abs(base[key] - branch[key]) < min(spreads), key
    assert (f"The points' own seconds ({base['sim_s']:.2f} s, {branch['sim_s']:.2f} s) and the whole command "
            f"({base['wall_s']:.2f} s, {branch['wall_s']:.2f} s) moved less than their runs spread") in text
