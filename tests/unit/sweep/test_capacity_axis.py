"""Capacity as an outer loop on the echo backend, the table across capacities, and the per-turn /
per-group breakdowns: exact values."""

from __future__ import annotations

import json

import pytest

from prefixstudy.sweep.capacity_axis import (capacity_config, capacity_table, collapse_lines, parse_capacity,
                                  reuse_footprint_blocks, working_set_blocks)
from prefixstudy.config import load_config
from prefixstudy.errors import UserError
from prefixstudy.metrics.breakdown import breakdown
from prefixstudy.results import load
from prefixstudy.study.orchestrate import run_study
from prefixstudy.workloads import load_rows
from prefixstudy.workloads.base import group_prefixes
from tests.sweeps import capacity_sweep

# One request open at a time: which blocks a request finds cached is then the arrival order's alone.
# Echo answers at once, but on a loaded machine a 20 ms stall let two requests overlap, and their
# blocks evicted a prefix the next request would have hit.
GROUPS = {"engine": {"kind": "echo", "block_size": 16}, "executor": "local", "arrivals.process": "constant",
          "dataset.kind": "groups", "dataset.groups": 6, "dataset.prefix_len": 32, "dataset.suffix_len": 4,
          "dataset.output_len": 2, "sweep.num_requests": 12, "sweep.warmup_requests": 0, "sweep.rates": [50],
          "sweep.max_concurrency": 1}


def test_parse_capacity_and_bad_values():
    assert parse_capacity("blocks=12,16") == ("blocks", [12.0, 16.0])
    assert parse_capacity("share=0.1") == ("share", [0.1])
    for bad, msg in [("pages=1", "UNIT=V1"), ("blocks=a", "numbers"), ("blocks=0", "> 0"), ("share=2", "at most 1")]:
        with pytest.raises(UserError, match=msg):
            parse_capacity(bad)


def test_capacity_config_sets_the_engine_argument():
    v = load_config(None, {})
    assert capacity_config(v, "blocks", 12).engine.extra_args == {"num_gpu_blocks_override": 12}
    assert capacity_config(v, "bytes", 2**28).engine.kv_cache_memory_bytes == 2**28
    s = capacity_config(v, "share", 0.2).engine
    assert (s.gpu_memory_utilization, s.kv_cache_memory_bytes) == (0.2, None)
    e = load_config(None, GROUPS)
    assert capacity_config(e, "blocks", 14).engine.num_blocks == 14
    with pytest.raises(UserError, match="blocks only"):
        capacity_config(e, "bytes", 1)


def test_working_set_is_the_blocks_reused_by_more_than_one_request():
    assert working_set_blocks(load_rows(load_config(None, GROUPS)), 16) == 12  # 6 groups x 2 prefix blocks


def test_reuse_footprint_counts_what_churns_the_cache_between_two_uses():
    """The H200 sweep's workload: 1800 shared + 200 unique tokens, 64 generated, round robin.  A
    request leaves 128 whole blocks (2063 computed tokens), so G groups need G x 128 between two uses
    of a prefix; with 48 groups and 80 requests only 32 groups come back (the working set is 32 x 112
    blocks) but all 48 requests between two uses churn the cache."""
    for groups, working_set, footprint in ((40, 40 * 112, 40 * 128), (48, 32 * 112, 48 * 128)):
        cfg = load_config(None, {"dataset.kind": "groups", "dataset.groups": groups, "dataset.prefix_len": 1800,
                                 "dataset.suffix_len": 200, "dataset.output_len": 64, "sweep.num_requests": 80,
                                 "dataset.mix": {"order": "round_robin"}, "engine.max_model_len": 4096})
        rows = load_rows(cfg)
        primes = [p for _, p in sorted(group_prefixes(rows).items()) if p]
        assert (working_set_blocks(rows, 16), reuse_footprint_blocks(rows, 16, primes)) == (working_set, footprint)


@pytest.mark.parametrize("override, unit, message", [
    ({}, "tier_blocks", "--capacity tier_blocks: the tier goes to the study's own arms that cache, and it runs none "
                        "(add one, e.g. arms: [{name: on-cpu}], and keep it in sweep.modes)"),
    ({"sweep.max_point_duration_s": 0.2}, "blocks",
     "field 'sweep.max_point_duration_s': 0.2 s is too short for 12 requests at 50 req/s; use at least 0 s"),
])
def test_a_refused_sweep_leaves_no_folder(tmp_path, override, unit, message):
    cfg = load_config(None, {**GROUPS, **override, "out": str(tmp_path / "res")})
    with pytest.raises(UserError) as e:
        capacity_sweep(cfg, unit, [14, 12])
    assert str(e.value) == message
    assert not (tmp_path / "res").exists()


@pytest.mark.slow
def test_sweep_writes_one_run_per_capacity_and_a_table(tmp_path):
    parent = capacity_sweep(load_config(None, {**GROUPS, "out": str(tmp_path)}), "blocks", [14, 12],
                            tmp_path / "sweep")
    assert json.loads((parent / "sweep.json").read_text()) == {"axes": {"capacity.blocks": [14, 12]}, "cells": [
        {"values": {"capacity.blocks": 14}, "dir": "blocks-14", "status": "complete", "working_set_blocks": 12,
         "reuse_footprint_blocks": 12},
        {"values": {"capacity.blocks": 12}, "dir": "blocks-12", "status": "complete", "working_set_blocks": 12,
         "reuse_footprint_blocks": 12}]}
    t = capacity_table(parent)
    on = t[t["mode"] == "on"]
    assert on["num_blocks"].tolist() == [14, 12]
    assert on["working_set_ratio"].tolist() == pytest.approx([12 / 13, 12 / 11])
    # 36-token prompts: all 12 hit 32 tokens when the working set fits; one hit of 16 when it does not.
    assert on["hit_rate_measured"].tolist() == pytest.approx([32 / 36, 16 / 432])
    assert on["hit_rate_estimated"].tolist() == pytest.approx([32 / 36, 16 / 432])
    assert on["hit_rate_expected"].tolist() == pytest.approx([32 / 36, 32 / 36])
    assert t["e2e_gain"].notna().sum() == 2 and t[t["mode"] == "off"]["e2e_gain"].isna().all()
    line, = collapse_lines(t)
    assert line.startswith("50 req/s: the hit rate collapses between blocks cached between two uses ÷ capacity 0.92 "
                           "(hit rate 0.889, E2E gain ") and "and 1.09 (hit rate 0.037, E2E gain " in line


def test_gains_are_against_the_configured_baseline():
    import pandas as pd

    from prefixstudy.sweep.capacity_axis import with_gain

    df = pd.DataFrame({"mode": ["cold", "warm", "cold", "warm"], "capacity": [1.0, 1.0, 2.0, 2.0], "rate": 1.0,
                       "mean_e2e_ms": [10.0, 5.0, 10.0, 8.0], "mean_ttft_ms": [4.0, 1.0, 4.0, 2.0]})
    g = with_gain(df, ["capacity"], "cold")
    assert g["e2e_gain"].tolist() == pytest.approx([float("nan"), 0.5, float("nan"), 0.2], nan_ok=True)
    assert g["ttft_gain"].tolist() == pytest.approx([float("nan"), 0.75, float("nan"), 0.5], nan_ok=True)


@pytest.mark.slow
def test_a_sweep_of_arms_named_neither_on_nor_off_reads_the_arm_against_its_baseline(tmp_path):
    from prefixstudy.sweep.capacity_axis import sweep_arms

    cfg = load_config(None, {**GROUPS, "out": str(tmp_path), "arms": [{"name": "cold", "prefix_caching": False},
                                                                      {"name": "warm"}],
                             "sweep.modes": ["cold", "warm"], "sweep.baseline": "cold"})
    parent = capacity_sweep(cfg, "blocks", [14, 12], tmp_path / "sweep")
    assert sweep_arms(parent) == ("warm", "cold")
    t = capacity_table(parent)
    warm = t[t["mode"] == "warm"]
    assert warm["hit_rate_measured"].tolist() == pytest.approx([32 / 36, 16 / 432])
    assert warm["e2e_gain"].notna().all() and t[t["mode"] == "cold"]["e2e_gain"].isna().all()
    line, = collapse_lines(t, arm="warm")
    assert line.startswith("50 req/s: the hit rate collapses between blocks cached between two uses ÷ capacity 0.92 "
                           "(hit rate 0.889, E2E gain ")


@pytest.mark.slow
def test_a_fleet_routed_by_two_policies_runs_each_policy_at_each_capacity(tmp_path):
    cfg = load_config(None, {**GROUPS, "out": str(tmp_path), "replicas": 2,
                             "router.policies": ["round_robin", "prefix_affinity"]})
    parent = capacity_sweep(cfg, "blocks", [14], tmp_path / "sweep")
    runs = json.loads((parent / "sweep.json").read_text())["cells"]
    assert [(r["values"], r["dir"]) for r in runs] == [
        ({"capacity.blocks": 14, "router.policy": "round_robin"}, "blocks-14-policy-round_robin"),
        ({"capacity.blocks": 14, "router.policy": "prefix_affinity"}, "blocks-14-policy-prefix_affinity")]
    assert [load(parent / r["dir"]).config["router"]["policies"] for r in runs] == [["round_robin"],
                                                                                   ["prefix_affinity"]]
    t = capacity_table(parent)
    assert t[["policy", "mode"]].values.tolist() == [["round_robin", "on"], ["round_robin", "off"],
                                                     ["prefix_affinity", "on"], ["prefix_affinity", "off"]]
    assert t["e2e_gain"].notna().tolist() == [True, False, True, False]  # against OFF under the same policy
    assert [line.split(":")[0] for line in collapse_lines(t)] == ["50 req/s (prefix_affinity)",
                                                                  "50 req/s (round_robin)"]
    from prefixstudy.report.capacity import write_capacity_report

    write_capacity_report(parent)
    assert (parent / "capacity.md").read_text().startswith("| capacity | policy | num_blocks |")
    assert (parent / "capacity.png").is_file()


def test_a_run_routes_by_one_policy(tmp_path):
    cfg = load_config(None, {**GROUPS, "out": str(tmp_path / "res"), "replicas": 2,
                             "router.policies": ["round_robin", "prefix_affinity"]})
    with pytest.raises(UserError) as e:
        run_study(cfg, progress=False)
    assert str(e.value) == ("field 'router.policies': a run routes by one policy, and 2 are given (round_robin, "
                            "prefix_affinity); give one, or compare them with `prefixstudy run` or `prefixstudy "
                            "capacity` (one run folder per policy)")
    assert not (tmp_path / "res").exists()


@pytest.mark.slow
def test_breakdown_per_turn_shows_later_turns_hit_more(tmp_path):
    cfg = load_config(None, {**GROUPS, "dataset.kind": "sessions", "dataset.groups": 1, "dataset.output_len": 8,
                             "dataset.suffix_len": 8, "dataset.sessions": {"turns": 3, "user_len": 8},
                             "sweep.num_requests": 6, "out": str(tmp_path)})
    b = breakdown(load(run_study(cfg, progress=False)).requests, "turn")
    on = b[b["mode"] == "on"]
    assert on["turn"].tolist() == [0, 1, 2] and on["n"].tolist() == [2, 2, 2]
    assert on["prompt_tokens_mean"].tolist() == [40, 56, 72]
    assert on["cached_share"].tolist() == pytest.approx([32 / 40, 32 / 56, 48 / 72])
    assert b[b["mode"] == "off"]["cached_share"].tolist() == [0.0, 0.0, 0.0]
    g = breakdown(load(run_study(load_config(None, {**GROUPS, "out": str(tmp_path / "g")}), progress=False)).requests,
                  "group")
    assert g[g["mode"] == "on"]["group"].tolist() == [0, 1, 2, 3, 4, 5]
    assert g[g["mode"] == "on"]["cached_share"].tolist() == pytest.approx([32 / 36] * 6)


@pytest.mark.slow
def test_report_has_capacity_per_turn_and_per_group_sections(tmp_path):
    from prefixstudy.report import build_report

    cfg = load_config(None, {**GROUPS, "dataset.kind": "sessions", "dataset.groups": 2, "dataset.output_len": 8,
                             "dataset.suffix_len": 8, "dataset.sessions": {"turns": 2, "user_len": 8},
                             "engine.num_blocks": 64, "sweep.num_requests": 8, "out": str(tmp_path)})
    run = run_study(cfg, progress=False)
    build_report(run, n_boot=50, formats=("png",))
    md = (run / "report.md").read_text()
    for title in ("## Cache capacity and eviction", "## Per turn", "## Per prefix group"):
        assert title in md
    from prefixstudy.report.workloads import capacity_frame

    cap = capacity_frame(load(run))
    assert cap[["rate", "block_size", "num_blocks", "evicted_blocks_estimated"]].values.tolist() == [[50, 16, 64, 0]]


@pytest.mark.slow
def test_sweeps_made_apart_merge_capacity_by_capacity(tmp_path):
    """ON ran capacities 14 and 12 on one machine, OFF ran 14 on another and 12 on a third: the
    merged sweep is the one-run sweep's table.  A capacity a sweep did not finish is left out."""
    from prefixstudy.results.merge import merge_capacity

    def sweep(name, modes, values):
        return capacity_sweep(load_config(None, {**GROUPS, "sweep.modes": modes, "out": str(tmp_path)}),
                              "blocks", values, tmp_path / name)

    on, off14, off12 = sweep("on", ["on"], [14, 12]), sweep("off14", ["off"], [14]), sweep("off12", ["off"], [12])
    index = json.loads((off12 / "sweep.json").read_text())  # a capacity cut off before its run finished
    index["cells"].append({"values": {"capacity.blocks": 99}, "dir": "blocks-99", "status": "interrupted"})
    (off12 / "sweep.json").write_text(json.dumps(index))
    (off12 / "blocks-99").mkdir()
    merged = merge_capacity([on, off14, off12], tmp_path / "m")
    index = json.loads((merged / "sweep.json").read_text())
    assert index["axes"] == {"capacity.blocks": [12, 14]} and [r["dir"] for r in index["cells"]] == ["blocks-12",
                                                                                                   "blocks-14"]
    t = capacity_table(merged)
    assert t[["capacity", "mode"]].values.tolist() == [[12, "on"], [12, "off"], [14, "on"], [14, "off"]]
    assert t[t["mode"] == "on"]["hit_rate_measured"].tolist() == pytest.approx([16 / 432, 32 / 36])
    assert t["e2e_gain"].notna().sum() == 2
    assert json.loads((merged / "blocks-12" / "manifest.json").read_text())["status"] == "complete"
    from prefixstudy.report.capacity import write_capacity_report

    write_capacity_report(merged)
    assert sorted(p.name for p in merged.glob("capacity.*")) == [
        "capacity.csv", "capacity.md", "capacity.png", "capacity.svg"]
    md = (merged / "capacity.md").read_text()
    assert md.splitlines()[0].startswith("| capacity | num_blocks | working_set_ratio | reuse_footprint_ratio | mode |")
    assert "- 50 req/s: the hit rate collapses between blocks cached between two uses ÷ capacity 0.92" in md


def test_merge_refuses_sweeps_in_different_units(tmp_path):
    from prefixstudy.results.merge import merge_capacity

    for name, unit in (("a", "blocks"), ("b", "bytes")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "sweep.json").write_text(json.dumps({"axes": {f"capacity.{unit}": []}, "cells": []}))
    with pytest.raises(UserError, match="different units"):
        merge_capacity([tmp_path / "a", tmp_path / "b"], tmp_path / "m")
