"""`--resume` checks what is on disk against the manifest: a finished point whose parts are missing,
truncated or short runs again, a lost summary.csv is rebuilt from the parts, an edited config.yaml
is refused in one line, and no file the run did not write is deleted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from prefixstudy.results.store import read_table
from tests import forkcli

REPO = Path(__file__).resolve().parents[3]
N = 4


def cli(*args) -> subprocess.CompletedProcess:
    return forkcli.run(args, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)


@pytest.fixture
def run_dir(tmp_path) -> Path:
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump({
        "study": "rc", "executor": "local", "out": str(tmp_path / "res"), "engine": {"kind": "echo"},
        "dataset": {"num_requests": N, "prefix_len": 32, "suffix_len": 4, "output_len": 2},
        "sweep": {"rates": [50, 100], "num_requests": N, "warmup_requests": 1},
    }))
    r = cli("run", p, "--no-report", "--quiet")
    assert r.returncode == 0, r.stderr
    (d,) = (tmp_path / "res" / "rc").iterdir()
    return d


def manifest(d: Path) -> dict:
    return json.loads((d / "manifest.json").read_text())


def started(d: Path) -> dict:
    return {(p["mode"], p["rate"]): p["started_at"] for p in manifest(d)["points"]}


def resume_ok(d: Path) -> subprocess.CompletedProcess:
    r = cli("run", "--resume", d, "--no-report", "--quiet")
    assert r.returncode == 0, r.stderr
    m = manifest(d)
    assert (m["status"], sorted(p["status"] for p in m["points"])) == ("complete", ["ok"] * 4)
    req = read_table(d / "requests.parquet")  # its parts (a file of the user's beside them is no part)
    assert len(req) == 4 * (N + 1)  # every point's measured requests and its warm-up, once
    assert pd.read_csv(d / "summary.csv")["n_ok"].tolist() == [N] * 4
    return r


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["deleted", "truncated", "short"])
def test_a_finished_point_whose_part_is_damaged_runs_again(run_dir, damage):
    before = started(run_dir)
    part = run_dir / "requests.parquet" / "on-50.parquet"
    if damage == "deleted":
        part.unlink()
        why = "requests.parquet/on-50.parquet is missing"
    elif damage == "truncated":
        part.write_bytes(part.read_bytes()[:100])
        why = "requests.parquet/on-50.parquet is unreadable (ArrowInvalid)"
    else:
        df = pd.read_parquet(part)
        df.iloc[:-1].to_parquet(part)
        why = f"requests.parquet/on-50.parquet holds {N - 1} of its {N} measured requests"
    r = resume_ok(run_dir)
    assert r.stderr == f"warning: {run_dir}: cache ON @ 50 req/s runs again: {why}\n"
    after = started(run_dir)
    assert after[("on", 50.0)] > before[("on", 50.0)]  # measured again
    assert {k: v for k, v in after.items() if k != ("on", 50.0)} == {k: v for k, v in before.items() if k != ("on", 50.0)}


@pytest.mark.slow
def test_a_lost_summary_is_rebuilt_from_the_parts_without_running_again(run_dir):
    before = started(run_dir)
    rows = pd.read_csv(run_dir / "summary.csv")
    (run_dir / "summary.csv").unlink()
    resume_ok(run_dir)
    assert started(run_dir) == before
    again = pd.read_csv(run_dir / "summary.csv")
    assert again[["mode", "rate", "repeat", "n_ok", "mean_e2e_ms"]].equals(rows[["mode", "rate", "repeat", "n_ok", "mean_e2e_ms"]])


@pytest.mark.slow
def test_an_edited_config_is_refused(run_dir):
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    cfg["sweep"]["rates"] = [50, 100, 200]
    (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    r = cli("run", "--resume", run_dir, "--no-report")
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr == (f"error: {run_dir / 'config.yaml'}: changed since the run started (it no longer matches "
                        "the manifest's config_sha256), so its points and new ones would mix two configs; refusing "
                        "to resume: start a new run with the changed config\n")


@pytest.mark.slow
def test_resume_deletes_only_the_parts_it_wrote(run_dir):
    m = manifest(run_dir)
    m["points"][0]["status"] = "failed"  # ON @ 50 to run again: its old parts go
    (run_dir / "manifest.json").write_text(json.dumps(m))
    mine = run_dir / "requests.parquet" / "notes.txt"
    mine.write_text("the user's")
    backup = run_dir / "requests.parquet" / "on-50-backup.parquet"  # not a part's name: the user's
    backup.write_bytes((run_dir / "requests.parquet" / "on-50.parquet").read_bytes())
    kept = backup.read_bytes()
    r = cli("run", "--resume", run_dir, "--no-report", "--quiet")
    assert r.returncode == 0, r.stderr
    assert mine.read_text() == "the user's" and backup.read_bytes() == kept
    assert sorted(p.name for p in (run_dir / "requests.parquet").iterdir()) == [
        "notes.txt", "off-100.parquet", "off-50.parquet", "on-100.parquet", "on-50-backup.parquet", "on-50.parquet"]
