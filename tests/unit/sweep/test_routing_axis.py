"""routing_sweep on in-process echo fleets: OFF only under ``router.off_policies``, and a sweep
stopped between policies (Ctrl-C, a deadline's SIGTERM) goes on from its parent with one
``prefixstudy run --resume``: finished points are kept, the policy that never began is run."""

from __future__ import annotations

import json

import pandas as pd
import pytest

import prefixstudy.study.orchestrate as study_mod
from prefixstudy.config import load_config
from prefixstudy.sweep.routing_axis import policy_config, read_sweep
from prefixstudy.report.routing import routing_report
from prefixstudy.sweep.run_sweep import run_sweep

BASE = {"engine": {"kind": "echo", "block_size": 16}, "executor": "local", "replicas": 2,
        "dataset.kind": "groups", "dataset.groups": 3, "dataset.prefix_len": 64, "dataset.suffix_len": 8,
        "dataset.output_len": 4, "sweep.num_requests": 6, "sweep.warmup_requests": 0, "sweep.rates": [50],
        "router.policies": ["round_robin", "prefix_affinity"], "router.off_policies": ["round_robin"]}


def points(run_dir) -> list[tuple[str, float, int, str]]:
    m = json.loads((run_dir / "manifest.json").read_text())
    return sorted((p["mode"], p["rate"], p["repeat"], p["status"]) for p in m["points"])


def test_off_runs_only_under_the_off_policies():
    cfg = load_config(None, BASE)
    assert policy_config(cfg, "round_robin").sweep.modes == ["on", "off"]
    assert policy_config(cfg, "prefix_affinity").sweep.modes == ["on"]
    assert policy_config(load_config(None, {**BASE, "sweep.modes": ["off"]}), "prefix_affinity") is None


@pytest.mark.slow
def test_a_sweep_stopped_before_its_second_policy_resumes_from_its_parent(tmp_path, monkeypatch):
    real = study_mod.run_study

    def stop_at_affinity(cfg, run_dir=None, progress=True, resume=None, resume_config=None):
        if cfg is not None and cfg.router.policies == ["prefix_affinity"]:
            raise KeyboardInterrupt  # as the CLI's SIGINT handler would, before any point of it
        return real(cfg, run_dir=run_dir, progress=progress, resume=resume, resume_config=resume_config)

    monkeypatch.setattr(study_mod, "run_study", stop_at_affinity)
    cfg = load_config(None, {**BASE, "out": str(tmp_path)})
    with pytest.raises(KeyboardInterrupt) as e:
        run_sweep(cfg, progress=False)
    parent = e.value.run_dir
    rr = parent / "policy-round_robin"
    assert points(rr) == [("off", 50.0, 0, "ok"), ("on", 50.0, 0, "ok")]
    assert not (parent / "policy-prefix_affinity").exists()
    assert list(read_sweep(parent)) == ["round_robin"]  # what exists is readable meanwhile
    before = pd.read_csv(rr / "summary.csv")

    monkeypatch.setattr(study_mod, "run_study", real)
    assert run_sweep(None, progress=False, resume=parent) == parent
    assert points(rr) == [("off", 50.0, 0, "ok"), ("on", 50.0, 0, "ok")]
    pd.testing.assert_frame_equal(pd.read_csv(rr / "summary.csv"), before)  # kept, not re-run
    assert points(parent / "policy-prefix_affinity") == [("on", 50.0, 0, "ok")]
    assert json.loads((parent / "sweep.json").read_text()) == {
        "axes": {"router.policy": ["round_robin", "prefix_affinity"]},
        "cells": [{"values": {"router.policy": "round_robin"}, "dir": "policy-round_robin", "status": "complete"},
                  {"values": {"router.policy": "prefix_affinity"}, "dir": "policy-prefix_affinity",
                   "status": "complete"}]}
    routing_report(parent)
    table = pd.read_csv(parent / "routing.csv")
    assert sorted(zip(table["policy"], table["mode"], strict=True)) == [
        ("prefix_affinity", "on"), ("round_robin", "off"), ("round_robin", "on")]
    # Affinity keeps each of the 3 groups on one replica: after the primes every request hits.
    aff = table[table["policy"] == "prefix_affinity"].iloc[0]
    assert aff["hit_rate_measured"] == pytest.approx(64 / 72)


@pytest.mark.slow
def test_a_fleet_that_does_not_start_is_one_line_per_policy_and_its_reason_stays_in_the_manifest(
        tmp_path, monkeypatch, caplog):
    """Found on 2 x H200: both policies' fleets failed to start, nothing said why, and the routing
    report then crashed on an empty table."""
    from prefixstudy.engines.echo import EchoEngine

    async def start(self):
        raise RuntimeError("CUDA driver error: invalid argument\nmore")

    monkeypatch.setattr(EchoEngine, "start", start)
    parent = run_sweep(load_config(None, {**BASE, "out": str(tmp_path)}), progress=False)
    reason = ("cache ON: the engine did not start (replica 0: RuntimeError: CUDA driver error: invalid argument); "
              "-v shows the engine's own log")  # in-process replicas: their log is on the console
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert [m.split(":")[0:2] for m in errors] == [["error", " policy-round_robin"], ["error", " policy-prefix_affinity"]]
    assert all(reason in m for m in errors)
    for policy in ("round_robin", "prefix_affinity"):
        manifest = json.loads((parent / f"policy-{policy}" / "manifest.json").read_text())
        assert manifest["status"] == "failed" and manifest["points"] == [] and manifest["error"] == reason
        assert "error_log" not in manifest
    assert routing_report(parent).read_text() == (
        "# Routing\n\nNo policy finished a point: see each policy's manifest.json (`error`).\n")
    monkeypatch.undo()  # the fleets start now: one --resume runs both policies, and the reason is gone
    run_sweep(None, progress=False, resume=parent)
    for policy, modes in (("round_robin", ["off", "on"]), ("prefix_affinity", ["on"])):
        manifest = json.loads((parent / f"policy-{policy}" / "manifest.json").read_text())
        assert manifest["status"] == "complete" and "error" not in manifest
        assert sorted(p["mode"] for p in manifest["points"]) == modes


def test_each_gpu_replica_compiles_into_its_own_cache():
    from prefixstudy.executors.ray_fleet import replica_env

    env = {"VLLM_CACHE_ROOT": "/c/prefixstudy-on", "X": "1"}
    assert replica_env(env, 1, use_gpu=True) == {"VLLM_CACHE_ROOT": "/c/prefixstudy-on-replica1", "X": "1"}
    assert replica_env(env, 1, use_gpu=False) is env
    assert replica_env({"X": "1"}, 0, use_gpu=True) == {"X": "1"}
