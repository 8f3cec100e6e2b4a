"""prefixstudy.ray_executor: planning and error lines (exact), then real engines in Ray actors.

Engine tests start 4 real tiny-model engines in all (about 50 s each on 2 cores): a two-mode
study through the CLI on a 2-CPU local cluster, and a one-mode study whose engine actor is
killed mid-point.  A Ray Jobs test submits the documented entrypoint (with --dry-run) to a
throwaway head node.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from prefixstudy.cli import main
from prefixstudy.config import load_config
from prefixstudy.errors import UserError
from prefixstudy.executors import pick_executor, resolve_executor
from prefixstudy.ray_executor import (ENGINE_ENV, actor_env, actor_name, plan_parallel,
                                      summarize_actor_error)
from prefixstudy.schema import ITERATION_COLUMNS, REQUEST_COLUMNS, SUMMARY_COLUMNS

ray = pytest.importorskip("ray")

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
# tiny-llama, 1198 + 16 prompt tokens, CPU block size 128: ON serves 9 blocks = 1152 of 1214 from cache.
HIT_ON = 1152 / 1214
TINY = ["--set", "sweep.num_requests=6", "--set", "sweep.warmup_requests=1", "--set", "dataset.output_len=16",
        "--set", "engine.gpu_memory_utilization=0.1"]
SEQUENTIAL_2CPU = ("auto: 2 CPUs; 2 CPU engines side by side need 2 x (1 + 2) = 6 CPUs (engine cores + load "
                   "generator and engine loop); modes run one after the other")


# --------------------------------------------------------------------------- planning, exact

def test_plan_two_cpus_runs_modes_one_after_the_other():
    assert plan_parallel("auto", 2, [{"CPU": 2.0}], False, 1, 1) == {
        "requested": "auto", "used": False, "reason": SEQUENTIAL_2CPU}


def test_plan_cpu_room_for_both():
    # 12 // (2 + 2) = 3 roomy slots >= 2
    assert plan_parallel("auto", 2, [{"CPU": 12}], False, 1, 2) == {
        "requested": "auto", "used": True,
        "reason": "auto: 12 CPUs fit 2 CPU engines of 2 + 2 CPUs side by side"}


def test_plan_gpu_one_node_of_eight_tp8_is_sequential():
    assert plan_parallel("auto", 2, [{"CPU": 96, "GPU": 8}], True, 8, 1) == {
        "requested": "auto", "used": False,
        "reason": "auto: the cluster fits only 1 engine of 8 GPU(s) (8 GPUs); modes run one after the other"}


def test_plan_gpu_two_nodes_tp8_and_one_node_tp4_are_parallel():
    two_nodes = [{"CPU": 96, "GPU": 8}, {"CPU": 96, "GPU": 8}]
    assert plan_parallel("auto", 2, two_nodes, True, 8, 1)["used"] is True
    assert plan_parallel("auto", 2, [{"CPU": 96, "GPU": 8}], True, 4, 1) == {
        "requested": "auto", "used": True, "reason": "auto: the cluster fits 2 engines of 4 GPU(s) side by side"}


def test_plan_gpu_engine_must_fit_on_one_node():
    # 2 nodes x 4 GPUs = 8 GPUs, but TP 8 needs them on one node.
    with pytest.raises(UserError, match="no room for one engine: it needs 8 GPUs on one node, "
                                        "the cluster has 8 GPUs, 32 CPUs over 2 node"):
        plan_parallel("auto", 2, [{"CPU": 16, "GPU": 4}] * 2, True, 8, 1)


def test_plan_on_off_and_one_mode():
    assert plan_parallel("on", 2, [{"CPU": 2}], False, 1, 1) == {
        "requested": "on", "used": True, "reason": "parallel on: both engines run side by side"}
    assert plan_parallel("off", 2, [{"CPU": 64}], False, 1, 1)["used"] is False
    assert plan_parallel("auto", 1, [{"CPU": 64}], False, 1, 1) == {
        "requested": "auto", "used": False, "reason": "one mode only"}
    with pytest.raises(UserError, match="--parallel on: the Ray cluster has room for one engine only"):
        plan_parallel("on", 2, [{"CPU": 96, "GPU": 8}], True, 8, 1)


def test_actor_error_is_one_line():
    text = ("The actor died unexpectedly before finishing this task.\n\tclass_name: EngineActor\n"
            "\tactor_id: 5f0c\n\tpid: 4242\n\tname: default/run/on\n\tnamespace: prefixstudy\n\tip: 10.0.0.1\n"
            "The actor is dead because its worker process has died. Worker exit type: UNEXPECTED_SYSTEM_EXIT "
            "Worker exit detail: Worker unexpectedly exits with a connection error code 2. End of file. "
            "There are some potential root causes. (1) The process is killed by SIGKILL by OOM killer.")

    class ActorDiedError(Exception):
        pass

    assert summarize_actor_error(ActorDiedError(text)) == (
        "ActorDiedError: The actor died unexpectedly before finishing this task.; pid 4242; "
        "UNEXPECTED_SYSTEM_EXIT; Worker unexpectedly exits with a connection error code 2.")


def test_actor_env(monkeypatch):
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "WARNING")
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "1")  # the driver's choice wins over the default
    monkeypatch.setenv("PYTHONPATH", "/opt/extra")
    env = actor_env()
    assert env["VLLM_LOGGING_LEVEL"] == "WARNING"
    assert env["VLLM_USE_FLASHINFER_SAMPLER"] == "0"
    assert env["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1"
    assert env["NCCL_NVLS_ENABLE"] == "1"
    assert env["PYTHONPATH"] == f"{REPO}{os.pathsep}/opt/extra"
    assert set(ENGINE_ENV) <= set(env)


def test_auto_executor_is_ray_when_ray_imports():
    cfg = load_config(REPO / "experiments/default.yaml")
    assert cfg.executor == "auto"
    assert resolve_executor("auto") == "ray" and resolve_executor("local") == "local"
    assert pick_executor(cfg).name == "ray"


def test_seed_config_dry_run():
    r = CliRunner().invoke(main, ["run", str(REPO / "experiments/seed-a100x8-tp8.yaml"), "--dry-run"])
    assert r.exit_code == 0, r.output
    assert r.output == ("ok: study seed-a100x8-tp8, 960 dataset rows, modes on,off, "
                        "rates 0.5,1,2,4,8,16,32 req/s, executor ray; nothing run (--dry-run)\n")
    cfg = load_config(REPO / "experiments/seed-a100x8-tp8.yaml")
    e = cfg.engine
    assert (e.tensor_parallel_size, e.dtype, e.max_num_batched_tokens, e.max_num_seqs, e.gpu_memory_utilization) \
        == (8, "bfloat16", 8192, 256, 0.9)
    assert cfg.model.endswith("experiments/models/mistral-7b-v0.3") and cfg.executor == "ray"
    assert (cfg.sweep.num_requests, cfg.sweep.min_duration_s, cfg.sweep.requests_for(32)) == (40, 30, 960)


@pytest.mark.parametrize("args, message", [
    (["--parallel", "sometimes"], "Invalid value for '--parallel'"),
    (["--executor", "k8s"], "Invalid value for '--executor'"),
])
def test_cli_rejects_bad_ray_flags(args, message):
    r = subprocess.run([str(BIN / "prefixstudy"), "run", "--dry-run", *args], capture_output=True, text=True)
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr


# --------------------------------------------------------------------------- real engines in actors

def _read_run(run_dir: Path):
    return (json.loads((run_dir / "manifest.json").read_text()), pd.read_parquet(run_dir / "requests.parquet"),
            pd.read_parquet(run_dir / "iterations.parquet"), pd.read_csv(run_dir / "summary.csv"))


def _assert_schema(req: pd.DataFrame, it: pd.DataFrame, summ: pd.DataFrame) -> None:
    """The columns and dtypes the local runner writes (schema.py)."""
    assert list(req.columns) == list(REQUEST_COLUMNS)
    assert list(it.columns) == list(ITERATION_COLUMNS)
    assert list(summ.columns) == SUMMARY_COLUMNS
    for frame, cols in ((req, REQUEST_COLUMNS), (it, ITERATION_COLUMNS)):
        for c, t in cols.items():
            assert str(frame[c].dtype) == ("object" if t == "str" else t), c


@pytest.mark.engine
@pytest.mark.timeout(400)
def test_cli_study_on_local_ray_cluster(tmp_path):
    """`prefixstudy run` with the default executor (auto -> ray), a 2-CPU local cluster it starts itself."""
    t0 = time.monotonic()
    r = subprocess.run([str(BIN / "prefixstudy"), "run", str(REPO / "experiments/default.yaml"), "--out",
                        str(tmp_path), "--rates", "4", *TINY, "--set", "ray.num_cpus=2", "--ray-address", "local",
                        "--parallel", "auto", "--no-report", "--quiet"],
                       capture_output=True, text=True, timeout=380)
    assert r.returncode == 0, r.stderr[-3000:]
    run_dir = Path(r.stdout.split("results: ")[1].split()[0])
    man, req, it, summ = _read_run(run_dir)
    _assert_schema(req, it, summ)

    assert man["executor"] == "ray" and man["status"] == "complete"
    assert man["parallel"] == {"requested": "auto", "used": False, "reason": SEQUENTIAL_2CPU}
    assert (man["ray"]["address"], man["ray"]["cluster_cpus"], man["ray"]["engine_resources"]) \
        == ("local", 2, {"CPU": 1})
    on, off = man["ray"]["engines"]["on"], man["ray"]["engines"]["off"]
    assert len(on) == len(off) == 1 and on[0]["pid"] != off[0]["pid"] and on[0]["block_size"] == 128
    # One after the other: OFF's point starts only after ON's point ended (and ON's engine with it).
    pts = {p["mode"]: p for p in man["points"]}
    assert pts["off"]["started_at"] > pts["on"]["started_at"] + pts["on"]["duration_s"]

    s = summ.set_index("mode")
    assert list(s["status"]) == ["ok", "ok"] and list(s["n_ok"]) == [6, 6] and list(s["n_sent"]) == [6, 6]
    assert s.loc["on", "hit_rate_measured"] == HIT_ON and s.loc["on", "hit_rate_expected"] == HIT_ON
    assert s.loc["off", "hit_rate_measured"] == 0.0
    measured = req[~req["warmup"]]
    assert len(measured) == 12 and len(req) == 14 and (req["error"] == "").all()
    assert (measured["output_tokens"] == 16).all()
    assert list(measured.groupby("mode")["num_cached_tokens"].unique().map(list)) == [[0], [1152]]  # off, on
    assert set(it["mode"]) == {"on", "off"}
    print(f"ray CLI study: {time.monotonic() - t0:.0f} s")


def _kill_during_point(name: str, rate: float, seen: dict, stop: threading.Event) -> None:
    """Find the named engine actor; once it has finished 2 measured requests of ``rate``, SIGKILL it."""
    while not stop.is_set():
        try:
            if not ray.is_initialized():
                raise LookupError
            st = ray.get(ray.get_actor(name, namespace="prefixstudy").status.remote(), timeout=10)
        except Exception:
            time.sleep(0.2)
            continue
        if st["rate"] == rate and st["requests_done"] >= 2:
            seen.update(st)
            os.kill(st["pid"], signal.SIGKILL)
            return
        time.sleep(0.05)


@pytest.mark.engine
@pytest.mark.timeout(400)
def test_killed_engine_actor_fails_its_point_and_the_sweep_goes_on(tmp_path):
    from prefixstudy.study import new_run_dir, run_study

    t0 = time.monotonic()
    cfg = load_config(REPO / "experiments/default.yaml", {
        "sweep.rates": [4, 8], "sweep.modes": ["on"], "sweep.num_requests": 6, "sweep.warmup_requests": 1,
        "dataset.output_len": 16, "engine.gpu_memory_utilization": 0.1, "executor": "ray",
        "ray.address": "local", "ray.num_cpus": 2, "out": str(tmp_path)})
    run_dir = new_run_dir(cfg)
    seen: dict = {}
    stop = threading.Event()
    killer = threading.Thread(target=_kill_during_point, args=(actor_name(cfg.study, run_dir, "on"), 4.0, seen, stop),
                              daemon=True)
    killer.start()
    try:
        run_study(cfg, run_dir=run_dir, progress=False)  # starts and shuts down its own local cluster
    finally:
        stop.set()
    assert seen, "the engine actor was never seen running the 4 req/s point"

    man, req, it, summ = _read_run(run_dir)
    _assert_schema(req, it, summ)
    s = summ.set_index("rate")
    assert list(s["status"]) == ["failed", "ok"]
    err = s.loc[4.0, "error"]
    assert err.startswith("ActorDiedError: The actor died unexpectedly") and f"pid {seen['pid']}" in err
    assert "\n" not in err
    assert s.loc[4.0, "n_ok"] == 0 and s.loc[8.0, "n_ok"] == 6 and s.loc[8.0, "hit_rate_measured"] == HIT_ON
    assert set(req["rate"]) == {8.0}  # the failed point's rows died with its actor
    assert man["status"] == "complete_with_failures"
    assert man["parallel"] == {"requested": "auto", "used": False, "reason": "one mode only"}
    engines = man["ray"]["engines"]["on"]
    assert [e["actor"] for e in engines] == [actor_name(cfg.study, run_dir, "on"),
                                              actor_name(cfg.study, run_dir, "on", 1)]
    assert engines[0]["pid"] == seen["pid"] != engines[1]["pid"]
    # The killed actor's engine processes went with it (the raylet reaps them).
    assert seen["children"]
    deadline = time.monotonic() + 30
    while any(_alive(p) for p in seen["children"]) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not [p for p in seen["children"] if _alive(p)]
    print(f"ray kill study: {time.monotonic() - t0:.0f} s")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


# --------------------------------------------------------------------------- Ray Jobs

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def ray_head(tmp_path):
    """A throwaway head node (its own temp dir, ports and auth token), stopped by its process id."""
    dash = _free_port()
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}", RAY_USAGE_STATS_ENABLED="0",
               RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(16))
    temp = Path(f"/tmp/ps-ray-{secrets.token_hex(3)}")  # short: Ray's socket paths must stay < 108 chars
    head = subprocess.Popen([str(BIN / "ray"), "start", "--head", "--block", f"--port={_free_port()}",
                             f"--dashboard-port={dash}", "--dashboard-host=127.0.0.1", "--num-cpus=1",
                             "--include-dashboard=true", f"--temp-dir={temp}"],
                            env=env, stdout=open(tmp_path / "head.log", "w"), stderr=subprocess.STDOUT,
                            start_new_session=True)
    address = f"http://127.0.0.1:{dash}"
    try:
        deadline = time.monotonic() + 120
        while subprocess.run([str(BIN / "ray"), "job", "list", "--address", address], env=env,
                             capture_output=True).returncode != 0:
            assert head.poll() is None and time.monotonic() < deadline, (tmp_path / "head.log").read_text()[-3000:]
            time.sleep(1)
        yield address, env
    finally:
        os.killpg(head.pid, signal.SIGTERM)
        try:
            head.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait(15)
        shutil.rmtree(temp, ignore_errors=True)


@pytest.mark.timeout(300)
def test_ray_job_submit_entrypoint(ray_head, tmp_path):
    """The README's `ray job submit --working-dir . -- prefixstudy run ...`, from a clean copy of the repo."""
    address, env = ray_head
    work = tmp_path / "checkout"  # what a clone holds (a local .venv would be uploaded too)
    for d in ("prefixstudy", "experiments"):
        shutil.copytree(REPO / d, work / d, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", work)

    def submit(*entrypoint: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(BIN / "ray"), "job", "submit", "--address", address, "--working-dir", ".",
                               "--", *entrypoint], cwd=work, env=env, capture_output=True, text=True, timeout=120)

    r = submit("prefixstudy", "run", "experiments/seed-a100x8-tp8.yaml", "--dry-run")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert ("ok: study seed-a100x8-tp8, 960 dataset rows, modes on,off, rates 0.5,1,2,4,8,16,32 req/s, "
            "executor ray; nothing run (--dry-run)") in r.stdout
    assert "succeeded" in r.stdout
    # Inside a job, ray.address 'local' joins the job's cluster (RAY_ADDRESS) rather than starting one.
    r = submit("python", "-c", "import ray; from prefixstudy.ray_executor import connect, alive_nodes; "
                               "print('joined', connect('local'), len(alive_nodes()), ray.cluster_resources()['CPU'])")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "joined True 1 1.0" in r.stdout
