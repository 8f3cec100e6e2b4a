"""`prefixstudy report RUN --rederive` on a copy of a committed study: what it rewrites, what it
leaves alone, what it prints, and the one line that refuses a folder without records."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest

from tests import forkcli
from tests.tables import assert_same_table

REPO = Path(__file__).resolve().parents[3]
STUDY = REPO / "experiments" / "results" / "h200-tp1-sync"


def _files(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


@pytest.mark.slow  # re-derives 28 points and builds the report
def test_rederive_rewrites_the_derived_tables_from_the_records_and_nothing_else(tmp_path):
    run = tmp_path / "h200-tp1"
    shutil.copytree(STUDY, run)
    # What an older analysis left: OFF 16 req/s repeat 2 flagged by a transient, OFF 32 repeat 1
    # not flagged, and no headline.csv.
    s = pd.read_csv(run / "summary.csv", keep_default_na=False)
    at = {(m, r, k): i for i, (m, r, k) in enumerate(zip(s["mode"], s["rate"], s["repeat"], strict=True))}
    s.loc[at[("off", 16.0, 1)], ["saturated", "saturation_reason"]] = [True, "in system 28.1->37.6"]
    s.loc[at[("off", 32.0, 0)], ["saturated", "saturation_reason"]] = [False, ""]
    s.to_csv(run / "summary.csv", index=False)
    (run / "headline.csv").unlink()
    before = _files(run)

    r = forkcli.run(["report", str(run), "--rederive"], cwd=tmp_path, timeout=300)
    assert (r.returncode, r.stderr) == (0, ""), r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == f"re-derived: {run} (summary.csv, headline.csv, manifest.json)"
    assert lines[1] == "  OFF 16 req/s repeat 2: saturated -> kept up"
    assert lines[2].startswith("  OFF 32 req/s repeat 1: kept up -> saturated: ran full: 100% of the window's")
    assert lines[3:] == [f"report: {run / 'report.html'}", f"report: {run / 'report.md'}"]

    after = _files(run)
    # the derived tables are today's: the committed ones (which experiments/resummarize.py wrote),
    # every flag and count exact, the fitted numbers to the last bits OpenBLAS leaves (tests/tables.py)
    for name in ("summary.csv", "headline.csv", "arms.csv"):
        assert after[name].partition(b"\n")[0] == (STUDY / name).read_bytes().partition(b"\n")[0], name  # same header
        assert_same_table(pd.read_csv(run / name), pd.read_csv(STUDY / name), name)
    # the records and the config are untouched; no file appears but headline.csv and the report's
    untouched = [k for k in before if k.startswith(("requests.parquet", "iterations.parquet")) or k == "config.yaml"]
    assert untouched and all(after[k] == before[k] for k in untouched)
    assert set(after) - set(before) == {"headline.csv"}


def test_rederive_refuses_a_folder_without_records_in_one_line(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    for name in ("manifest.json", "summary.csv", "config.yaml"):
        shutil.copy(STUDY / name, run / name)
    before = _files(run)
    r = forkcli.run(["report", str(run), "--rederive"], cwd=tmp_path, timeout=120)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr == f"error: {run}: no request records (requests.parquet/); nothing to re-derive from\n"
    assert _files(run) == before
