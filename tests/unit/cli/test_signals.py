"""Ctrl-C and SIGTERM stop a run wherever they land: exit 130 / 143, the manifest `interrupted`,
nothing after the interrupted point run, and `--resume` finishes the rest.

Each case runs the real CLI in a subprocess on the echo backend.  The signal is sent by the process
to itself from a hook at a known phase, not after a sleep: the prime or first warm-up request as the
engine starts it, a measured request while the others are still being sent (dispatch) or the last
one (drain: every request sent, the point waiting for answers), the first point's summary, and the
study's final summary.  From the signal on, every request the engine is asked for waits until the
run's stop cancels it, so no point can finish after the signal however late the event loop takes it
on a loaded machine, and the requests need no cost that makes the phases last (a run that ignored
the signal would hang until the subprocess timeout, and fail).
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path

import pandas as pd
import pytest
import yaml

from tests import forkcli

REPO = Path(__file__).resolve().parents[3]

# Runs the CLI with one hook that signals this process once, at the phase named in argv[1].
DRIVER = textwrap.dedent('''
    import os, signal, sys
    phase, signum = sys.argv[1], getattr(signal, sys.argv[2])
    sys.argv = ["prefixstudy"] + sys.argv[3:]
    fired = []

    def fire():
        if not fired:
            fired.append(1)
            os.kill(os.getpid(), signum)

    import asyncio
    from prefixstudy.engines import echo
    generate = echo.EchoEngine.generate
    marks = {"prime": "-prime", "warmup": "-warmup0-", "dispatch": "-m5-", "drain": "-m19-"}

    async def hooked(self, prompt, n, rid, trace):
        if phase in marks and marks[phase] in rid:
            fire()
        if fired:  # from the signal on, no request finishes: each waits for the stop to cancel it
            await asyncio.get_running_loop().create_future()
        return await generate(self, prompt, n, rid, trace)

    echo.EchoEngine.generate = hooked
    from prefixstudy.study import orchestrate as study
    point_done = study.Study.point_done

    def summarised(self, res):
        row = point_done(self, res)
        if phase == "summarise":
            fire()
        return row

    study.Study.point_done = summarised
    pick_executor = study.pick_executor

    def picked(*a, **k):  # the run folder exists, its manifest not yet
        if phase == "folder":
            fire()
        return pick_executor(*a, **k)

    study.pick_executor = picked
    from prefixstudy.results import writer
    finish_run = writer.finish_run

    def finish(*a, **k):
        if phase == "finish":
            fire()
        return finish_run(*a, **k)

    writer.finish_run = finish
    from prefixstudy.cli import entrypoint
    entrypoint()
''')


def echo_config(tmp: Path) -> Path:
    p = tmp / "c.yaml"
    p.write_text(yaml.safe_dump({
        "study": "sig", "executor": "local", "out": str(tmp / "res"),
        "engine": {"kind": "echo"},
        "dataset": {"num_requests": 20, "prefix_len": 64, "suffix_len": 1, "output_len": 2},
        "sweep": {"rates": [200, 400], "num_requests": 20, "warmup_requests": 1, "max_point_duration_s": 60},
    }))
    return p


def run(args: list, phase: str = "none", signame: str = "SIGINT") -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    # A suite started in the background inherits SIGINT ignored; the child must not.
    return forkcli.run([phase, signame, *args], cwd=REPO, env=env, timeout=120, code=DRIVER, sigint_default=True)


def only_run(tmp: Path) -> Path:
    (d,) = (tmp / "res" / "sig").iterdir()
    return d


def manifest(d: Path) -> dict:
    return json.loads((d / "manifest.json").read_text())


# phase -> the points (mode, rate) saved when the signal lands on the first point of ON at 200 req/s
SAVED_BEFORE = {"prime": [], "warmup": [], "dispatch": [], "drain": [], "summarise": [("on", 200.0)],
                "finish": [("on", 200.0), ("off", 200.0), ("off", 400.0), ("on", 400.0)]}  # arms take turns


@pytest.mark.parametrize("signame", ["SIGINT", "SIGTERM"])
def test_a_signal_before_the_manifest_says_so_and_leaves_no_empty_folder(tmp_path, signame):
    r = run(["run", echo_config(tmp_path), "--no-report", "--quiet"], "folder", signame)
    assert r.returncode == (130 if signame == "SIGINT" else 143), r.stderr
    assert r.stderr.splitlines() == ["interrupted before any results were written"]
    assert not (tmp_path / "res" / "sig").exists() or not any((tmp_path / "res" / "sig").iterdir())


@pytest.mark.slow
@pytest.mark.parametrize("signame", ["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("phase", list(SAVED_BEFORE))
def test_a_signal_stops_the_run_and_resume_finishes_it(tmp_path, phase, signame):
    first = run(["run", echo_config(tmp_path), "--no-report", "--quiet"], phase, signame)
    d = only_run(tmp_path)
    assert first.returncode == (130 if signame == "SIGINT" else 143), first.stderr
    assert first.stderr.splitlines()[-1] == (
        f"interrupted: finished points are saved; continue with: prefixstudy run --resume {d}")
    assert "Traceback" not in first.stderr
    m = manifest(d)
    assert m["status"] == "interrupted"
    saved = [(p["mode"], p["rate"]) for p in m["points"]]
    assert saved == SAVED_BEFORE[phase]  # nothing ran after the signal
    assert all(p["status"] == "ok" for p in m["points"])

    again = run(["run", "--resume", d, "--no-report", "--quiet"])
    assert again.returncode == 0, again.stderr
    m = manifest(d)
    assert m["status"] == "complete"
    assert sorted((p["mode"], p["rate"], p["status"]) for p in m["points"]) == [
        ("off", 200.0, "ok"), ("off", 400.0, "ok"), ("on", 200.0, "ok"), ("on", 400.0, "ok")]
    req = pd.read_parquet(d / "requests.parquet")
    assert len(req) == 4 * 21  # 20 measured + 1 warm-up per point, none twice, none of the interrupted try
    assert (req["error"] == "").all()
    summary = pd.read_csv(d / "summary.csv")
    assert summary["n_ok"].tolist() == [20, 20, 20, 20]
