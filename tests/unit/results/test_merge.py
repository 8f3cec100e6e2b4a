"""`prefixstudy merge`: runs of one study made apart (ON on one machine, OFF on another) become one
run whose files are exactly the two runs' files together."""

import pandas as pd
import pytest

from prefixstudy.config import load_config
from prefixstudy.results import load
from prefixstudy.results.merge import merge_runs
from prefixstudy.study.orchestrate import run_study

ECHO = {"engine": {"kind": "echo", "block_size": 16}, "executor": "local", "arrivals.process": "constant",
        "dataset.prefix_len": 40, "dataset.suffix_len": 8, "dataset.output_len": 4,
        "sweep.num_requests": 5, "sweep.warmup_requests": 1, "sweep.rates": [25, 50]}


@pytest.mark.slow
def test_merge_joins_an_on_run_and_an_off_run(tmp_path):
    on = load(run_study(load_config(None, {**ECHO, "sweep.modes": ["on"], "out": str(tmp_path / "a")}),
                        progress=False))
    off = load(run_study(load_config(None, {**ECHO, "sweep.modes": ["off"], "out": str(tmp_path / "b")}),
                         progress=False))
    merged = load(merge_runs([on.path, off.path], tmp_path / "m"))
    assert merged.config["sweep"]["modes"] == ["on", "off"]
    assert [(p["mode"], p["rate"], p["status"]) for p in merged.manifest["points"]] == [
        ("on", 25.0, "ok"), ("on", 50.0, "ok"), ("off", 25.0, "ok"), ("off", 50.0, "ok")]
    assert [m["modes"] for m in merged.manifest["merged_from"]] == [["on"], ["off"]]
    assert merged.manifest["status"] == "complete"
    pd.testing.assert_frame_equal(merged.summary, pd.concat([on.summary, off.summary], ignore_index=True))
    pd.testing.assert_frame_equal(merged.requests, pd.concat([on.requests, off.requests], ignore_index=True))
    assert len(merged.iterations) == len(on.iterations) + len(off.iterations) == 4 * 5
