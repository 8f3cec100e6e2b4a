"""One run per folder: a new run's folder is made atomically, and a run's folder is locked while
it is written, so a `--resume` of a run still going is refused and one of a killed run goes on."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from prefixstudy.config import StudyConfig
from prefixstudy.errors import UserError
from prefixstudy.results.writer import RunLock, new_run_dir
from tests import forkcli

REPO = Path(__file__).resolve().parents[3]


def cli(*args) -> subprocess.CompletedProcess:
    return forkcli.run(args, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)


def test_each_call_makes_its_own_folder_within_one_second(tmp_path):
    cfg = StudyConfig.model_validate({"study": "s", "out": str(tmp_path), "engine": {"kind": "echo"}})
    dirs = [new_run_dir(cfg) for _ in range(5)]
    assert len(set(dirs)) == 5  # an exists() check before a later mkdir gave the same path five times
    assert all(d.is_dir() and not any(d.iterdir()) for d in dirs)


def test_a_second_lock_is_refused_and_a_released_one_taken(tmp_path):
    first = RunLock(tmp_path).acquire()
    assert (tmp_path / "run.lock").read_text() == f"{os.getpid()}\n"
    with pytest.raises(UserError) as e:
        RunLock(tmp_path).acquire()  # flock: a second descriptor is refused, even in one process
    assert str(e.value) == (f"{tmp_path}: a run is still writing this folder (pid {os.getpid()}); "
                            "wait for it to end, or stop it, then resume")
    first.release()
    assert not (tmp_path / "run.lock").exists()
    RunLock(tmp_path).acquire().release()


def echo_run(tmp: Path) -> Path:
    p = tmp / "c.yaml"
    p.write_text(yaml.safe_dump({
        "study": "lock", "executor": "local", "out": str(tmp / "res"), "engine": {"kind": "echo"},
        "dataset": {"num_requests": 4, "prefix_len": 32, "suffix_len": 4, "output_len": 2},
        "sweep": {"rates": [50], "num_requests": 4, "warmup_requests": 0},
    }))
    r = cli("run", p, "--no-report", "--quiet")
    assert r.returncode == 0, r.stderr
    (d,) = (tmp / "res" / "lock").iterdir()
    assert not (d / "run.lock").exists()  # a finished run leaves no lock
    return d


@pytest.mark.slow
def test_resume_of_a_run_still_going_is_refused_and_of_a_dead_one_goes_on(tmp_path):
    d = echo_run(tmp_path)
    m = json.loads((d / "manifest.json").read_text())
    m["points"] = [{**p, "status": "failed"} for p in m["points"]]  # one point left to run
    (d / "manifest.json").write_text(json.dumps(m))
    # Another process holds the folder's lock, as a run still going does.
    holder = subprocess.Popen([sys.executable, "-c", "import sys; from prefixstudy.results.writer import RunLock; "
                               f"RunLock({str(d)!r}).acquire(); print('held', flush=True); sys.stdin.read()"],
                              cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        r = cli("run", "--resume", d, "--no-report")
        assert r.returncode == 2
        assert r.stderr == (f"error: {d}: a run is still writing this folder (pid {holder.pid}); "
                            "wait for it to end, or stop it, then resume\n")
        assert json.loads((d / "manifest.json").read_text())["points"][0]["status"] == "failed"  # untouched
    finally:
        os.kill(holder.pid, signal.SIGKILL)  # dies holding the lock, as a kill -9'd run does
        holder.wait()
    assert (d / "run.lock").read_text() == f"{holder.pid}\n"  # a stale lock of a dead pid
    r = cli("run", "--resume", d, "--no-report", "--quiet")
    assert r.returncode == 0, r.stderr
    m = json.loads((d / "manifest.json").read_text())
    assert (m["status"], [p["status"] for p in m["points"]]) == ("complete", ["ok", "ok"])
    assert not (d / "run.lock").exists()
