"""The report's first line names the vLLM engine the points measured: the default one, which
schedules step N+1 while step N runs, or one step at a time, as each arm's engine resolved it."""

from __future__ import annotations

from prefixstudy.report.tables import scheduling_text


def _points(**by_mode):
    return [{"mode": m, "rate": r, "async_scheduling": v} for m, v in by_mode.items() for r in (1.0, 2.0)]


def test_the_default_engine_is_named_as_such():
    assert scheduling_text(_points(on=True, off=True)) == (
        "; vLLM's async scheduling on (its default on GPUs: step N+1 is scheduled while step N runs)")


def test_an_engine_run_one_step_at_a_time_is_named_as_such():
    assert scheduling_text(_points(on=False, off=False)) == "; vLLM's async scheduling off (one engine step at a time)"


def test_arms_that_ran_different_engines_are_each_named():
    assert scheduling_text(_points(on=True, off=False, tier=True)) == (
        "; vLLM's async scheduling on in arms `on`, `tier`, off in arm `off`")


def test_points_whose_engine_does_not_say_add_nothing():
    # echo, HTTP servers and runs recorded before the key existed
    assert scheduling_text(_points(on=None, off=None)) == scheduling_text([{"mode": "on", "rate": 1.0}]) == ""
