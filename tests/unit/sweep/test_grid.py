"""A grid of any config field, run by the one sweep loop (``sweep.run_sweep``) on echo engines: a
cell per value under one parent, its index written whole, a refused grid leaving no folder, and
a sweep stopped between cells going on from its parent."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import yaml

import prefixstudy.study.orchestrate as study_mod
from prefixstudy.config import load_config
from prefixstudy.errors import UserError
from prefixstudy.sweep.run_sweep import run_sweep
from tests import forkcli

PROMPT = 1214  # tokens: a 1198-token shared prefix and a 16-token suffix
ECHO = {"study": "grid", "executor": "local", "engine": {"kind": "echo", "decode_ms_per_token": 0.2},
        "dataset.prefix_len": 1198, "dataset.suffix_len": 16, "dataset.output_len": 4,
        "sweep.rates": [20], "sweep.num_requests": 12, "sweep.warmup_requests": 1,
        "grid": {"engine.prefill_ms_per_token": [0.01, 0.05]}}


def index(parent) -> dict:
    return json.loads((parent / "sweep.json").read_text())


@pytest.mark.slow
def test_each_value_of_a_field_is_a_cell_whose_run_has_it(tmp_path):
    parent = run_sweep(load_config(None, {**ECHO, "out": str(tmp_path)}), progress=False)
    assert index(parent) == {"axes": {"engine.prefill_ms_per_token": [0.01, 0.05]}, "cells": [
        {"values": {"engine.prefill_ms_per_token": 0.01}, "dir": "prefill_ms_per_token-0.01", "status": "complete"},
        {"values": {"engine.prefill_ms_per_token": 0.05}, "dir": "prefill_ms_per_token-0.05", "status": "complete"}]}
    assert yaml.safe_load((parent / "config.yaml").read_text())["grid"] == ECHO["grid"]  # what was asked
    cfgs = [yaml.safe_load((parent / c / "config.yaml").read_text()) for c in
            ("prefill_ms_per_token-0.01", "prefill_ms_per_token-0.05")]
    assert [(c["engine"]["prefill_ms_per_token"], c["grid"]) for c in cfgs] == [(0.01, {}), (0.05, {})]
    s = {v: pd.read_csv(parent / f"prefill_ms_per_token-{v}" / "summary.csv").set_index("mode") for v in (0.01, 0.05)}
    # The cache is the cells' only common part: ON hits the shared prefix's 74 whole blocks in both.
    assert [s[v].loc["on", "hit_rate_measured"] for v in s] == pytest.approx([1184 / PROMPT] * 2)
    # OFF prefills the whole prompt at the cell's cost: a sleep is never shorter than asked, so the
    # median TTFT is at least that; at 0.01 ms/token it stays under the 0.05 cell's floor.
    assert s[0.05].loc["off", "p50_ttft_ms"] >= 0.05 * PROMPT
    assert s[0.01].loc["off", "p50_ttft_ms"] < 0.05 * PROMPT
    # `prefixstudy report PARENT` reads any sweep: each cell's report (a field axis has no table of its own).
    r = forkcli.run(("report", parent), cwd=tmp_path, timeout=300)
    assert (r.returncode, r.stdout) == (0, f"report: each cell's report.html, under {parent}\n"), r.stderr
    assert [(parent / c["dir"] / "report.html").is_file() for c in index(parent)["cells"]] == [True, True]


@pytest.mark.parametrize("grid, message", [
    ({"engine.prefill_ms_per_token": [0.01, -1]},
     "field 'grid.engine.prefill_ms_per_token' = -1: field 'engine.prefill_ms_per_token': Input should be greater "
     "than or equal to 0"),
    ({"engine.no_such_field": [1]}, "field 'grid.engine.no_such_field' = 1: field 'engine.no_such_field': unknown key"),
    ({"capacity.pages": [1]}, "field 'grid.capacity.pages': no capacity unit 'pages' (one of blocks, bytes, share, "
                              "offload_gib, tier_blocks)"),
])
def test_a_refused_grid_is_one_line_and_leaves_no_folder(tmp_path, grid, message):
    cfg = load_config(None, {**ECHO, "grid": grid, "out": str(tmp_path / "res")})
    with pytest.raises(UserError) as e:
        run_sweep(cfg, progress=False)
    assert str(e.value) == message
    assert not (tmp_path / "res").exists()


def test_a_grid_field_without_values_is_refused_by_the_schema():
    with pytest.raises(UserError) as e:
        load_config(None, {**ECHO, "grid": {"engine.block_size": []}})
    assert str(e.value) == "--set grid: field 'grid': Value error, engine.block_size: give at least one value"


@pytest.mark.slow
def test_a_sweep_stopped_between_cells_resumes_from_its_parent(tmp_path, monkeypatch):
    real = study_mod.run_study

    def stop_at_second(cfg, run_dir=None, progress=True, resume=None, resume_config=None):
        if cfg is not None and cfg.engine.prefill_ms_per_token == 0.05:
            raise KeyboardInterrupt  # as the CLI's SIGINT handler would, before the cell's first point
        return real(cfg, run_dir=run_dir, progress=progress, resume=resume, resume_config=resume_config)

    monkeypatch.setattr(study_mod, "run_study", stop_at_second)
    with pytest.raises(KeyboardInterrupt) as e:
        run_sweep(load_config(None, {**ECHO, "out": str(tmp_path)}), progress=False)
    parent = e.value.run_dir
    assert [c.get("status") for c in index(parent)["cells"]] == ["complete", None]
    first = parent / "prefill_ms_per_token-0.01"
    before = pd.read_csv(first / "summary.csv")
    monkeypatch.setattr(study_mod, "run_study", real)
    assert run_sweep(None, progress=False, resume=parent) == parent
    assert [c["status"] for c in index(parent)["cells"]] == ["complete", "complete"]
    pd.testing.assert_frame_equal(pd.read_csv(first / "summary.csv"), before)  # kept, not run again
    assert sorted(pd.read_csv(parent / "prefill_ms_per_token-0.05" / "summary.csv")["mode"]) == ["off", "on"]


def test_a_dry_run_names_every_cell(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"engine": {"kind": "echo"}, "executor": "local",
                                   "grid": {"engine.prefill_ms_per_token": [0.01, 0.05], "capacity.blocks": [64]}},
                                  sort_keys=False))
    r = forkcli.run(("run", cfg, "--dry-run", "--out", tmp_path / "res"), cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-1] == ("grid: 2 cells over engine.prefill_ms_per_token, capacity.blocks, each a run "
                                         "folder under one parent: prefill_ms_per_token-0.01-blocks-64, "
                                         "prefill_ms_per_token-0.05-blocks-64")
    assert not (tmp_path / "res").exists()


def test_a_sweep_takes_its_parent_folder_as_str(tmp_path):
    # From a script a folder is often a str: the grid's parent goes there, each cell a run under it.
    cfg = load_config(None, {**ECHO, "sweep.rates": [100], "sweep.num_requests": 3})
    parent = run_sweep(cfg, progress=False, run_dir=str(tmp_path / "sweep"))
    assert parent == tmp_path / "sweep"
    assert [(c["dir"], c["status"]) for c in index(parent)["cells"]] == [
        ("prefill_ms_per_token-0.01", "complete"), ("prefill_ms_per_token-0.05", "complete")]
