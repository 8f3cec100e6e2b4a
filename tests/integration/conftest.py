"""One Ray head for the integration tests that need a cluster but not a cluster of their own.

Each Ray start costs seconds of two busy cores, so the tests that only need *a* cluster (job
submission, a failing engine start inside an actor, `vllm serve` inside a mode's actor, one echo
engine per arm side by side) share a single head, started by the first of them and stopped at
the end of the session.  It is a real `ray start --head` with its job server, as a user's cluster
is: 9 logical CPUs (three CPU engines of 1 + 2 side by side), no GPUs (so a CPU engine never
plans for GPUs), its own temp dir, ports and auth token.

Nothing joins it by accident: RAY_ADDRESS is set only inside the tests that ask for it
(``ray_address``), and its address file lies in its own temp dir, so a bare ``ray.init()``
elsewhere still starts a cluster of its own.  Tests whose claim is about the cluster itself keep
theirs: a 2-CPU cluster that must run the modes in turn, fake GPUs, two nodes.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent
HEAD_CPUS = 9


@dataclass(frozen=True)
class RayHead:
    address: str  # the GCS, host:port: ray.init(address=...) and RAY_ADDRESS
    port: int  # the GCS's (a manifest records the address with this machine's IP for 127.0.0.1)
    dashboard: str  # the job server: `ray job submit --address ...`
    env: dict  # for `ray` CLI calls: its token and PATH
    cpus: int


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Head:
    """The head's process and what its start changed in this process, to undo once."""

    def __init__(self, tmp: Path):
        from ray._raylet import AuthenticationTokenLoader, Config

        self._reload = lambda: (Config.initialize(""), AuthenticationTokenLoader.instance().reset_cache())
        auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(16)}
        self.saved = {k: os.environ.get(k) for k in (*auth, "RAY_AUTH_TOKEN_PATH")}
        os.environ.update(auth)
        os.environ.pop("RAY_AUTH_TOKEN_PATH", None)
        self._reload()  # token mode and this token, in this process too
        gcs, dash = _free_port(), _free_port()
        # No idle workers made ahead (Ray would start one per logical CPU, nine Python processes on two
        # cores, beside whatever else the suite runs): each actor gets its worker when it asks.
        env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}", RAY_USAGE_STATS_ENABLED="0",
                   RAY_enable_worker_prestart="0", RAY_prestart_worker_first_driver="0")
        self.temp = Path(f"/tmp/ps-ray-{secrets.token_hex(3)}")  # short: Ray's socket paths must stay < 108 chars
        log = tmp / "head.log"
        self.proc = subprocess.Popen(
            [str(BIN / "ray"), "start", "--head", "--block", f"--port={gcs}", f"--dashboard-port={dash}",
             "--dashboard-host=127.0.0.1", f"--num-cpus={HEAD_CPUS}", "--num-gpus=0", "--include-dashboard=true",
             f"--temp-dir={self.temp}"],
            env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True)
        self.info = RayHead(f"127.0.0.1:{gcs}", gcs, f"http://127.0.0.1:{dash}", env, HEAD_CPUS)
        deadline = time.monotonic() + 120
        # `ray start` writes the address file once its GCS and raylet are up; the job server follows.
        while not (self.temp / "ray_current_cluster").exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                pytest.fail(f"the shared Ray head did not come up: {log.read_text()[-3000:]}")
            time.sleep(0.5)

    def stop(self) -> None:
        import ray

        if self.proc is None:
            return
        if ray.is_initialized():  # a test's connection to the head, left open
            ray.shutdown()
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            # `ray start --block` lingers on SIGTERM (over 15 s on 2 cores); its group goes down with SIGKILL.
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(15)
        self.proc = None
        shutil.rmtree(self.temp, ignore_errors=True)
        for k, v in self.saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        self._reload()


_head: dict = {}  # "head": the running _Head; "last": the nodeid of the last test that uses it


@pytest.fixture(scope="session")
def ray_head(tmp_path_factory):
    """The shared head: started by the first test that asks for it, stopped after the last one
    (``pytest_runtest_teardown``) so it does not idle beside the rest of the suite, and at the end
    of the session in any case.

    Its token goes into this process's environment while it runs: Ray's token loader caches what it
    read, so a cluster a later test starts in this process must see the token this process presents.
    """
    import ray

    if ray.is_initialized():  # an earlier test's connection, to a cluster of its own
        ray.shutdown()
    head = _head["head"] = _Head(tmp_path_factory.mktemp("ray-head"))
    try:
        yield head.info
    finally:
        head.stop()


@pytest.hookimpl(trylast=True)  # the final order: the last user stops the head
def pytest_collection_modifyitems(items):
    users = [it.nodeid for it in items if "ray_head" in getattr(it, "fixturenames", ())]
    if users:
        _head["last"] = users[-1]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item):
    yield  # the test's own fixtures (its connection to the head) are gone by now
    if item.nodeid == _head.get("last") and "head" in _head:
        _head.pop("head").stop()


@pytest.fixture
def ray_address(ray_head, monkeypatch):
    """RAY_ADDRESS names the shared head for this test only: ``ray.address: local`` joins it (as
    inside a Ray job) instead of starting a cluster, and leaves it up."""
    monkeypatch.setenv("RAY_ADDRESS", ray_head.address)
    return ray_head


@pytest.fixture(scope="session")
def server_study(tmp_path_factory):
    """The one `vllm-server` study that test_http_study and test_vllm_server_study read
    (tests/integration/servers.py): two server starts for both files."""
    from tests.integration.servers import run_server_study

    return run_server_study(tmp_path_factory.mktemp("server-study"))
