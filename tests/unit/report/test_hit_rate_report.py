"""The shared-fraction sweep's report end to end on echo: one real run per fraction under a parent
folder with its sweep.json, ``prefixstudy report PARENT`` through the CLI, and the index's errors
as one line each."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from prefixstudy.config import load_config
from prefixstudy.errors import UserError
from prefixstudy.metrics.hit_rate_axis import AXIS, HIT_RATE_COLUMNS
from prefixstudy.report.hit_rate import cell_run, read_sweep
from prefixstudy.study.orchestrate import run_study
from tests import forkcli

# Echo prices every uncached prompt token (0.2 ms: OFF's 243 ms dwarfs a busy machine's timer
# jitter) and output token: ON saves the cached share.  Three repeats: the t interval's t(2).
ECHO = {"engine": {"kind": "echo", "block_size": 16, "prefill_ms_per_token": 0.2, "decode_ms_per_token": 0.5},
        "executor": "local", "arrivals.process": "constant", "dataset.output_len": 4, "sweep.num_requests": 10,
        "sweep.warmup_requests": 0, "sweep.rates": [50], "sweep.repeats": 3}
FRACTIONS = [0, 0.5, 0.95]


@pytest.fixture(scope="module")
def parent(tmp_path_factory):
    root = tmp_path_factory.mktemp("sweep")
    cells = []
    for f in FRACTIONS:
        d = f"{AXIS}-{f}"
        run_study(load_config(None, {**ECHO, AXIS: f}), root / d, progress=False)
        cells.append({"values": {AXIS: f}, "dir": d})
    (root / "sweep.json").write_text(json.dumps({"axes": {AXIS: FRACTIONS}, "cells": cells}))
    return root


@pytest.mark.slow
def test_report_parent_draws_gain_against_hit_rate(parent):
    r = forkcli.run(["report", str(parent)], timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [f"hit rate: {parent / 'report.html'}",
                                     f"report: each cell's report.html, under {parent}"]
    assert (parent / "plots" / "gain_vs_hit_rate.png").is_file()
    t = pd.read_csv(parent / "hit_rate.csv")
    assert list(t.columns) == HIT_RATE_COLUMNS
    assert t["shared_fraction"].tolist() == FRACTIONS and t["rate"].tolist() == [50.0] * 3
    # Measured and implied agree exactly: 0, 592 and 1152 cached of 1214 tokens in 16-token blocks.
    assert t["hit_rate"].tolist() == [0.0, 592 / 1214, 1152 / 1214]
    assert t["hit_rate_workload"].tolist() == t["hit_rate"].tolist() and t["hit_rate_ok"].all()
    # Of OFF's 244.8 ms of prefill and decode ON saves 118 at 0.5 (0.48) and 230 at 0.95 (0.94).
    assert 0.3 < t["gain_mean_e2e"].iloc[1] < 0.7 < t["gain_mean_e2e"].iloc[2] < 1.0
    assert t["pays"].iloc[2]
    md = (parent / "report.md").read_text()
    first = md.splitlines()[2]
    assert first.startswith("**Caching starts to pay (the mean-E2E gain's 95 % interval above 0, there and at "
                            "every higher hit rate) at hit rate ")
    assert first.endswith(" at 50 req/s.**")


def index(root, fractions):
    """A sweep folder: sweep.json and one run folder (a manifest alone) per fraction."""
    cells = []
    for f in fractions:
        (root / f"{AXIS}-{f}").mkdir(parents=True)
        (root / f"{AXIS}-{f}" / "manifest.json").write_text("{}")
        cells.append({"values": {AXIS: f}, "dir": f"{AXIS}-{f}"})
    (root / "sweep.json").write_text(json.dumps({"axes": {AXIS: fractions}, "cells": cells}))
    return root


def test_the_index_is_read_and_its_errors_are_one_line(tmp_path):
    parent = index(tmp_path / "sweep", FRACTIONS)
    assert read_sweep(parent) == {float(f): parent / f"{AXIS}-{f}" for f in FRACTIONS}
    run = parent / f"{AXIS}-0.5"
    # A cell's folder is its run, or a study folder of runs, or a results root holding one study.
    assert cell_run(run) == run
    (tmp_path / "root" / "study").mkdir(parents=True)
    (tmp_path / "root" / "study" / "20261203-000000").symlink_to(run, target_is_directory=True)
    assert cell_run(tmp_path / "root") == tmp_path / "root" / "study" / "20261203-000000"
    assert cell_run(tmp_path / "root" / "study") == tmp_path / "root" / "study" / "20261203-000000"
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "sweep.json").write_text(json.dumps({"axes": {"engine.max_num_seqs": [8]}, "cells": []}))
    with pytest.raises(UserError, match=r"sweep.json: the sweep has no 'dataset.shared_fraction' axis "
                                        r"\(axes: engine.max_num_seqs\)$"):
        read_sweep(bad)
    (bad / "sweep.json").write_text(json.dumps({"axes": {AXIS: [0.5], "sweep.rates": [1]}, "cells": []}))
    with pytest.raises(UserError, match="reads one run per shared fraction; this sweep also varies sweep.rates$"):
        read_sweep(bad)
    (bad / "sweep.json").write_text(json.dumps({"axes": {AXIS: [0.5]}, "cells": [{"values": {AXIS: 0.5},
                                                                                  "dir": "gone"}]}))
    with pytest.raises(UserError, match=r"cell 0 \(dataset.shared_fraction 0.5\): folder .*gone not found$"):
        read_sweep(bad)
    r = forkcli.run(["report", str(bad)], timeout=60)
    assert r.returncode == 2 and r.stdout == "" and r.stderr.count("\n") == 1 and "gone not found" in r.stderr


def test_one_run_s_flags_are_refused_on_a_sweep(tmp_path):
    parent = index(tmp_path, [0.5])
    r = forkcli.run(["report", str(parent), "--slo", "e2e=100", "--point", "8"], timeout=60)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr == (f"error: --slo, --point: for one run's report; {parent} is a sweep's folder (its "
                        "sweep.json): report one of its cells for those\n")


@pytest.mark.slow
def test_compare_reads_a_sweep_parent_as_its_cells(parent, tmp_path):
    """``compare PARENT`` overlays the sweep's cells, each labelled with its folder; a parent beside
    a plain study adds that study after them."""
    from prefixstudy.report.compare import build_compare, expand_sweeps

    cells = [parent / f"{AXIS}-{f}" for f in FRACTIONS]
    assert expand_sweeps([parent]) == [(c, c.name) for c in cells]
    assert expand_sweeps([parent, cells[0]]) == [*((c, c.name) for c in cells), (cells[0], "")]
    out = build_compare([parent], tmp_path / "cmp", formats=("png",))
    md = (out.parent / "report.md").read_text()
    labels = [line.removeprefix("## ") for line in md.splitlines() if line.startswith("## ")]
    assert labels[:3] == [f"default / cpu / TP=1 [{c.name}]" for c in cells]
    with pytest.raises(UserError, match=r"^compare needs at least two results folders \(or a sweep of two cells"):
        build_compare([cells[0]], tmp_path / "one")
