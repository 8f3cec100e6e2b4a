"""The saturation detector's error rates (benchmarks/saturation_error_rates.py): the committed
measurement meets the targets, and the file's points are what this code gives (re-simulated on
vLLM's scheduler, judged again)."""

from __future__ import annotations

import math

import pytest

from tests.scripts import load_script

rates = load_script("benchmarks/saturation_error_rates.py")


@pytest.fixture(scope="module")
def rows():
    return rates.read_rows()


def test_the_committed_measurement_meets_the_targets(rows):
    table = rates.rates(rows)
    assert rates.meets_targets(table) == []
    caps = {r["mode"]: r for r in rows if r["kind"] == "capacity"}
    assert set(caps) == {"on", "off"} and all(c["unfinished_at_end"] == 0 for c in caps.values())
    for length in rates.TARGET_LENGTHS:
        for mode in ("on", "off"):
            at = {r["load"]: r for r in table if r["length"] == length and r["mode"] == mode}
            assert sorted(at) == list(rates.LOADS)
            assert all(r["points"] >= 100 for r in at.values())  # enough for a 2 % rate to mean something
            assert at[0.8]["flagged"] <= 2 and at[1.1]["share"] >= 0.95


def test_targets_catch_a_detector_that_misses_them():
    # A wrong detector's rows: 3 of 100 stationary points flagged, 94 of 100 overloaded ones.
    bad = [{"kind": "point", "length": "15 s", "mode": "off", "load": 0.8, "saturated": i < 3} for i in range(100)]
    bad += [{"kind": "point", "length": "15 s", "mode": "off", "load": 1.1, "saturated": i < 94} for i in range(100)]
    bad += [{"kind": "point", "length": "84 requests", "mode": "off", "load": 0.8, "saturated": True}]
    assert rates.meets_targets(rates.rates(bad)) == ["15 s off at 0.8: 3.0% flagged > 2%",
                                                    "15 s off at 1.1: 94.0% flagged < 95%"]


def test_half_load_and_wilson():
    assert rates.half_load([(0.8, 0.0), (0.9, 0.2), (1.0, 0.8), (1.1, 1.0)]) == pytest.approx(0.95)
    assert math.isnan(rates.half_load([(0.8, 0.0), (1.1, 0.4)]))
    lo, hi = rates.wilson(0, 100)
    assert lo == 0.0 and hi == pytest.approx(0.0370, abs=1e-4)


@pytest.mark.slow  # builds two simulated engines (a vLLM import)
def test_points_of_the_file_are_what_this_code_gives(rows):
    caps = {r["mode"]: r["capacity_req_s"] for r in rows if r["kind"] == "capacity"}
    picked = [r for r in rows if r["kind"] == "point" and r["length"] == "15 s" and r["repeat"] == rates.FIRST_REPEAT + 3
              and r["load"] in (0.8, 1.1)]
    assert len(picked) == 4
    for r in picked:
        got = rates.point(r["mode"], r["length"], r["load"], caps[r["mode"]], r["repeat"])
        assert got == r
