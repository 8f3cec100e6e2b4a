"""Arms taking turns point by point (sweep.interleave_arms), on the echo backend: the order the
points ran in, a resumed run that goes on taking turns, and shares that cannot stay up together."""

from __future__ import annotations

import json

import pytest

from prefixstudy.config import load_config
from prefixstudy.engines import IterationSample
from prefixstudy.errors import UserError
from prefixstudy.study.preflight import check_plan
from prefixstudy.runner import iteration_frame
from prefixstudy.study.orchestrate import Study, run_study

ECHO = {"engine": {"kind": "echo", "block_size": 16}, "executor": "local", "arrivals.process": "constant",
        "dataset.prefix_len": 40, "dataset.suffix_len": 8, "dataset.output_len": 4,
        "sweep.num_requests": 4, "sweep.warmup_requests": 0, "sweep.rates": [50, 100], "sweep.repeats": 2}


def started(run_dir) -> list[tuple[str, float, int]]:
    """The points of a run in the order they started."""
    pts = json.loads((run_dir / "manifest.json").read_text())["points"]
    return [(p["mode"], p["rate"], p["repeat"]) for p in sorted(pts, key=lambda p: p["started_at"])]


def test_arms_take_turns_abba_point_by_point(tmp_path):
    run = run_study(load_config(None, {**ECHO, "out": str(tmp_path)}), progress=False)
    # A B, B A along the sweep, and each rate's second repeat starts with the other arm
    assert started(run) == [("on", 50.0, 0), ("off", 50.0, 0), ("off", 100.0, 0), ("on", 100.0, 0),
                            ("off", 50.0, 1), ("on", 50.0, 1), ("on", 100.0, 1), ("off", 100.0, 1)]


def test_without_interleaving_one_arm_runs_its_whole_sweep_first(tmp_path):
    run = run_study(load_config(None, {**ECHO, "out": str(tmp_path), "sweep.interleave_arms": False}),
                    progress=False)
    assert [m for m, _, _ in started(run)] == ["on"] * 4 + ["off"] * 4


def test_a_resumed_run_takes_turns_over_what_is_left_and_skips_what_each_arm_has():
    cfg = load_config(None, ECHO)
    writer = type("W", (), {"points": [{"mode": "on", "rate": 50.0, "repeat": 0, "status": "ok"},
                                       {"mode": "off", "rate": 50.0, "repeat": 0, "status": "ok"},
                                       {"mode": "off", "rate": 100.0, "repeat": 0, "status": "ok"}],
                            "dir": None})()
    ((sub, plan),) = Study(cfg, writer).pending()
    assert plan.turns(sub) == [("on", 100.0, 0), ("off", 50.0, 1), ("on", 50.0, 1), ("on", 100.0, 1),
                                 ("off", 100.0, 1)]


def test_engines_that_cannot_stay_up_together_are_refused_in_one_line():
    cfg = load_config(None, {"engine.gpu_memory_utilization": 0.9, "executor": "local"})
    with pytest.raises(UserError, match=r"^field 'engine.gpu_memory_utilization': 2 arms x 0.9 do not fit .* "
                                        r"use at most 0.47, or sweep.interleave_arms: false$"):
        check_plan(cfg)
    check_plan(load_config(None, {"engine.gpu_memory_utilization": 0.45, "executor": "local"}))
    check_plan(load_config(None, {"engine.gpu_memory_utilization": 0.9, "executor": "local",
                                  "sweep.interleave_arms": False}))


def test_a_step_timed_on_the_gpu_costs_its_span_and_keeps_its_host_stamps():
    common = (0, 0, 0, 8, 100, 0, 8, 8, 8, 0, 0.1)
    steps = [IterationSample(10.0, 10.010, *common, gpu_ms=5.5), IterationSample(10.010, 10.013, *common)]
    it = iteration_frame("on", 4.0, steps, t0=9.0, timing="engine-async")
    assert it["timing"].tolist() == ["gpu-span", "engine-async"]
    assert it["step_ms"].round(6).tolist() == [5.5, 3.0]
    assert it["host_step_ms"].round(6).tolist() == [10.0, 3.0]
    assert it["step_start_s"].round(6).tolist() == [1.0, 1.01]
