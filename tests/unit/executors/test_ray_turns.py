"""The Ray executor's arms take turns point by point where the cluster places every arm's engine at
once but cannot run them side by side (a 2-CPU machine: the default study under `executor: auto`),
and the console's note for the layouts that do neither is one line of at most 120 characters."""

from __future__ import annotations

import pytest

from prefixstudy.config import load_config
from prefixstudy.executors import base as executors
from prefixstudy.executors.ray_plan import one_after_the_other, plan_parallel

TWO_CPUS = [{"CPU": 2.0}]


def test_two_cpus_place_both_cpu_engines_and_the_arms_take_turns():
    assert plan_parallel("auto", 2, TWO_CPUS, False, 1, 1, interleave=True) == {
        "requested": "auto", "used": False, "turns": True,
        "reason": "auto: 2 CPUs; 2 CPU engines side by side need 2 x (1 + 2) = 6 CPUs (engine cores + load "
                  "generator and engine loop); both engines are placed at once and the arms take turns point by point"}


def test_without_interleaving_or_without_room_for_every_engine_the_arms_run_one_after_the_other():
    assert plan_parallel("auto", 2, TWO_CPUS, False, 1, 1, interleave=False)["turns"] is False
    assert plan_parallel("auto", 2, [{"CPU": 1.0}], False, 1, 1, interleave=True) == {
        "requested": "auto", "used": False, "turns": False,
        "reason": "auto: 1 CPUs; 2 CPU engines side by side need 2 x (1 + 2) = 6 CPUs (engine cores + load "
                  "generator and engine loop); modes run one after the other"}
    # One GPU holds one engine of TP 1: the other cannot be placed beside it.
    assert plan_parallel("auto", 2, [{"GPU": 1, "CPU": 16}], True, 1, 1, interleave=True)["turns"] is False
    # Fleets run side by side or one after the other.
    assert plan_parallel("auto", 2, [{"GPU": 2, "CPU": 16}], True, 1, 1, replicas=2, interleave=True)["turns"] is False


def test_side_by_side_wins_and_parallel_off_takes_turns():
    assert plan_parallel("auto", 2, [{"GPU": 2, "CPU": 16}], True, 1, 1, interleave=True)[
        "used"] is True  # and not turns: the points run in step
    assert plan_parallel("off", 3, [{"GPU": 8, "CPU": 96}], True, 2, 1, interleave=True) == {
        "requested": "off", "used": False, "turns": True,
        "reason": "parallel off: all 3 engines are placed at once and the arms take turns point by point"}
    assert plan_parallel("off", 2, [{"GPU": 8, "CPU": 96}], True, 8, 1, interleave=True)["reason"] == \
        "parallel off: modes run one after the other"


@pytest.mark.parametrize("plan", [
    plan_parallel("auto", 2, [{"GPU": 1, "CPU": 16}], True, 1, 1, interleave=True),
    plan_parallel("auto", 3, [{"CPU": 5}], False, 1, 2, interleave=True),  # room for 2 engines of 2 CPUs
    plan_parallel("auto", 2, [{"GPU": 2, "CPU": 16}], True, 1, 1, replicas=2),
])
def test_auto_one_after_the_other_is_one_console_line_of_at_most_120_characters(plan):
    note = one_after_the_other(plan)
    assert note and len(note) <= 120 and "\n" not in note


def test_turns_side_by_side_and_asked_for_layouts_print_no_note():
    assert one_after_the_other(plan_parallel("auto", 2, TWO_CPUS, False, 1, 1, interleave=True)) == ""
    assert one_after_the_other(plan_parallel("auto", 2, [{"GPU": 2, "CPU": 16}], True, 1, 1)) == ""
    assert one_after_the_other(plan_parallel("off", 2, [{"GPU": 1, "CPU": 16}], True, 1, 1)) == ""


def test_the_default_study_takes_turns_on_either_executor_and_shares_one_device_only_in_process(monkeypatch):
    monkeypatch.setattr(executors, "ray_installed", lambda: True)
    cfg = load_config(None)
    assert executors.resolve_executor(cfg.executor, cfg.engine.kind, cfg.ray.address) == "ray"
    assert executors.interleaved(cfg) and not executors.shares_one_device(cfg)
    local = load_config(None, {"executor": "local"})
    assert executors.interleaved(local) and executors.shares_one_device(local)
    assert not executors.interleaved(load_config(None, {"sweep.interleave_arms": False}))
    assert not executors.interleaved(load_config(None, {"sweep.modes": ["on"]}))
