"""prefixstudy.executors.ray: planning and error lines (exact), then real engines in Ray actors.

The engine tests share one study (three tiny-model engine starts, about 50 s each on 2 idle
cores): `prefixstudy run` on a 2-CPU local cluster, ON and OFF kept up together and taking turns
point by point, with OFF's engine actor killed mid-point: that cluster is its own, since the claim
is what the plan does with 2 CPUs.  A Ray Jobs test submits the documented entrypoint (with --dry-run) to the session's shared
head node (tests/integration/conftest.py).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pandas as pd
import psutil
import pytest
from click.testing import CliRunner

from prefixstudy.cli import main
from prefixstudy.config import load_config
from prefixstudy.errors import UserError
from prefixstudy.executors import pick_executor, resolve_executor
from prefixstudy.engines.vllm import ENGINE_ENV
from prefixstudy.executors.ray_actor import actor_env
from prefixstudy.executors.ray_plan import plan_parallel, summarize_actor_error
from prefixstudy.schema import ITERATION_COLUMNS, REQUEST_COLUMNS, SUMMARY_COLUMNS

import ray  # noqa: E402  (the cpu extra installs it; never skip the Ray tests)

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
# tiny-llama, 1198 + 16 prompt tokens, CPU block size 128: ON serves 9 blocks = 1152 of 1214 from cache.
HIT_ON = 1152 / 1214
TINY = ["--set", "sweep.num_requests=6", "--set", "sweep.warmup_requests=1", "--set", "dataset.output_len=16",
        "--set", "engine.gpu_memory_utilization=0.1", "--set", "engine.enforce_eager=true"]
SEQUENTIAL_2CPU = ("auto: 2 CPUs; 2 CPU engines side by side need 2 x (1 + 2) = 6 CPUs (engine cores + load "
                   "generator and engine loop); modes run one after the other")
TURNS_2CPU = SEQUENTIAL_2CPU.replace("modes run one after the other",
                                     "both engines are placed at once and the arms take turns point by point")


# --------------------------------------------------------------------------- planning, exact

def test_plan_two_cpus_runs_modes_one_after_the_other_without_interleaving_and_in_turns_with_it():
    assert plan_parallel("auto", 2, [{"CPU": 2.0}], False, 1, 1) == {
        "requested": "auto", "used": False, "turns": False, "reason": SEQUENTIAL_2CPU}
    assert plan_parallel("auto", 2, [{"CPU": 2.0}], False, 1, 1, interleave=True) == {
        "requested": "auto", "used": False, "turns": True, "reason": TURNS_2CPU}


def test_plan_cpu_room_for_both():
    # 12 // (2 + 2) = 3 roomy slots >= 2
    assert plan_parallel("auto", 2, [{"CPU": 12}], False, 1, 2) == {
        "requested": "auto", "used": True, "turns": False,
        "reason": "auto: 12 CPUs fit 2 CPU engines of 2 + 2 CPUs side by side"}


def test_plan_gpu_one_node_of_eight_tp8_is_sequential():
    assert plan_parallel("auto", 2, [{"CPU": 96, "GPU": 8}], True, 8, 1) == {
        "requested": "auto", "used": False, "turns": False,
        "reason": "auto: the cluster fits only 1 engine of 8 GPU(s) (8 GPUs); modes run one after the other"}


def test_plan_gpu_two_nodes_tp8_and_one_node_tp4_are_parallel():
    two_nodes = [{"CPU": 96, "GPU": 8}, {"CPU": 96, "GPU": 8}]
    assert plan_parallel("auto", 2, two_nodes, True, 8, 1)["used"] is True
    assert plan_parallel("auto", 2, [{"CPU": 96, "GPU": 8}], True, 4, 1) == {
        "requested": "auto", "used": True, "turns": False, "reason": "auto: the cluster fits 2 engines of 4 GPU(s) side by side"}


def test_plan_gpu_engine_must_fit_on_one_node():
    # 2 nodes x 4 GPUs = 8 GPUs, but TP 8 needs them on one node.
    with pytest.raises(UserError, match="no room for one engine: it needs 8 GPUs on one node, "
                                        "the cluster has 8 GPUs, 32 CPUs over 2 node"):
        plan_parallel("auto", 2, [{"CPU": 16, "GPU": 4}] * 2, True, 8, 1)


def test_plan_on_off_and_one_mode():
    assert plan_parallel("on", 2, [{"CPU": 2}], False, 1, 1) == {
        "requested": "on", "used": True, "turns": False, "reason": "parallel on: both engines run side by side"}
    assert plan_parallel("off", 2, [{"CPU": 64}], False, 1, 1)["used"] is False
    assert plan_parallel("auto", 1, [{"CPU": 64}], False, 1, 1, interleave=True) == {
        "requested": "auto", "used": False, "turns": False, "reason": "one mode only"}
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
    env = actor_env(load_config(None), "on", use_gpu=False)
    assert env["VLLM_LOGGING_LEVEL"] == "WARNING"
    assert env["VLLM_USE_FLASHINFER_SAMPLER"] == "0"
    assert env["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1"
    assert env["NCCL_NVLS_ENABLE"] == "1"
    assert env["PYTHONPATH"] == f"{REPO}{os.pathsep}/opt/extra"
    assert set(ENGINE_ENV) <= set(env)


def test_auto_executor_is_ray_when_ray_imports():
    cfg = load_config(REPO / "prefixstudy/configs/default.yaml")
    assert cfg.executor == "auto"
    assert resolve_executor("auto") == "ray" and resolve_executor("local") == "local"
    assert pick_executor(cfg).name == "ray"


def test_seed_config_dry_run():
    r = CliRunner().invoke(main, ["run", str(REPO / "prefixstudy/configs/seed-a100x8-tp8.yaml"), "--dry-run"])
    assert r.exit_code == 0, r.output
    assert r.output == ("ok: study seed-a100x8-tp8, 1920 dataset rows, modes on,off, "
                        "rates 0.5,1,2,4,8,16,24,32,48,64 req/s, executor ray; nothing run (--dry-run)\n"
                        # This machine has no CUDA GPU: the dry run says so and still checks the rest.
                        "note: cannot run here: field 'device': cuda asked for, but torch sees no CUDA GPU here; "
                        "a Ray cluster's GPUs would do\n")
    cfg = load_config(REPO / "prefixstudy/configs/seed-a100x8-tp8.yaml")
    e = cfg.engine
    assert (e.tensor_parallel_size, e.dtype, e.max_num_batched_tokens, e.max_num_seqs, e.gpu_memory_utilization) \
        == (8, "bfloat16", 8192, 256, 0.9)
    assert cfg.model.endswith("prefixstudy/configs/models/mistral-7b-v0.3") and cfg.executor == "ray"
    assert (cfg.sweep.num_requests, cfg.sweep.min_duration_s, cfg.sweep.requests_for(64)) == (40, 30, 1920)


@pytest.mark.parametrize("name, tp, parallel", [("seed-h200x8-tp8", 8, "auto"),
                                                ("seed-h200x8-tp4-parallel", 4, "on")])
def test_h200x8_configs(name, tp, parallel):
    """The 8 x H200 runs (TP 8; ON and OFF at once at TP 4), ready: the seed workload at 0.5 to 64 req/s."""
    r = CliRunner().invoke(main, ["run", str(REPO / f"prefixstudy/configs/{name}.yaml"), "--dry-run"])
    assert r.output == (f"ok: study {name}, 1920 dataset rows, modes on,off, "
                        "rates 0.5,1,2,4,8,16,32,64 req/s, executor ray; nothing run (--dry-run)\n"
                        "note: cannot run here: field 'device': cuda asked for, but torch sees no CUDA GPU here; "
                        "a Ray cluster's GPUs would do\n")
    cfg = load_config(REPO / f"prefixstudy/configs/{name}.yaml")
    assert (cfg.engine.tensor_parallel_size, cfg.ray.parallel, cfg.dataset.prefix_len, cfg.dataset.suffix_len,
            cfg.dataset.output_len) == (tp, parallel, 1198, 16, 143)
    nodes = [{"CPU": 128, "GPU": 8}]
    assert plan_parallel(cfg.ray.parallel, 2, nodes, True, tp, 1)["used"] is (tp == 4)


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


def _kill_during_point(out: Path, mode: str, seen: dict, stop: threading.Event) -> None:
    """SIGKILL ``mode``'s engine actor 1 s into its first point.  The pid is the one the actor's
    ``start()`` reported (the manifest records it); the point is running once Ray titles the
    process ``ray::EngineActor.run_point``.  No Ray call from this thread: see the note below."""
    pid = None
    while not stop.is_set():
        time.sleep(0.05)
        if pid is None:
            for m in out.glob("default/*/manifest.json"):
                try:
                    engines = json.loads(m.read_text()).get("engines", {}).get(mode, [])
                except ValueError:  # being replaced right now
                    continue
                pid = engines[0]["pid"] if engines else None
            continue
        try:
            with open(f"/proc/{pid}/cmdline") as f:
                running = "run_point" in f.read()
        except FileNotFoundError:
            return
        if running:
            seen["children"] = [p.pid for p in psutil.Process(pid).children(recursive=True)]
            time.sleep(1.0)
            seen["pid"] = pid
            os.kill(pid, signal.SIGKILL)
            return
# Note: with Ray 2.60.0, SIGKILL of an actor that a second handle (ray.get_actor from another
# thread of the driver) had been calling took the local raylet and GCS down with it (4 of 4 tries);
# with only the executor's own handle in use, the actor dies alone (3 of 3).


class _Collect(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture(scope="module")
def ray_study(tmp_path_factory):
    """`prefixstudy run` (in this process, so the test can reach the actors) with the default executor
    (auto -> ray) on a 2-CPU local cluster it starts itself; OFF's engine actor is killed during its
    4 req/s point.  Three engine starts: ON, OFF, OFF's replacement."""
    out = tmp_path_factory.mktemp("ray")
    seen: dict = {}
    stop = threading.Event()
    killer = threading.Thread(target=_kill_during_point, args=(out, "off", seen, stop), daemon=True)
    warned = _Collect()
    logging.getLogger("prefixstudy.executors.ray").addHandler(warned)
    t0 = time.monotonic()
    killer.start()
    try:
        with pytest.raises(SystemExit) as done:
            main(["run", str(REPO / "prefixstudy/configs/default.yaml"), "--out", str(out), "--rates", "4,8", *TINY,
                  "--set", "ray.num_cpus=2", "--ray-address", "local", "--parallel", "auto", "--no-report",
                  "--quiet"])
    finally:
        stop.set()
        killer.join(15)
        logging.getLogger("prefixstudy.executors.ray").removeHandler(warned)
    seen["warnings"] = [r.getMessage() for r in warned.records if r.levelno == logging.WARNING]
    (run_dir,) = (out / "default").iterdir()
    print(f"ray study: {time.monotonic() - t0:.0f} s; killed {seen}")
    return run_dir, done.value.code, seen


@pytest.mark.engine
@pytest.mark.timeout(600)
def test_ray_results_have_the_local_runners_schema(ray_study):
    run_dir, code, _ = ray_study
    man, req, it, summ = _read_run(run_dir)
    assert list(req.columns) == list(REQUEST_COLUMNS)
    assert list(it.columns) == list(ITERATION_COLUMNS)
    assert list(summ.columns) == SUMMARY_COLUMNS
    for frame, cols in ((req, REQUEST_COLUMNS), (it, ITERATION_COLUMNS)):
        for c, t in cols.items():
            ok = pd.api.types.is_string_dtype(frame[c]) if t == "str" else str(frame[c].dtype) == t
            assert ok, (c, frame[c].dtype, t)
    assert set(it["mode"]) == {"on", "off"}


@pytest.mark.engine
def test_ray_study_values(ray_study):
    run_dir, code, seen = ray_study
    man, req, it, summ = _read_run(run_dir)
    assert code == 1  # a failed point: the CLI says so, after writing everything
    # 2 CPUs place both CPU engines, not side by side: they take turns, which needs no note.
    assert [w for w in seen["warnings"] if w.startswith("ray:")] == []
    assert man["executor"] == "ray" and man["status"] == "complete_with_failures"
    assert (man["ray"]["address"], man["ray"]["cluster_cpus"], man["ray"]["engine_resources"]) \
        == ("local", 2, {"CPU": 1})
    s = summ.set_index(["mode", "rate"])
    assert list(s["status"]) == ["ok", "ok", "failed", "ok"]  # on 4, on 8, off 4, off 8
    assert list(s["n_ok"]) == [6, 6, 0, 6]
    assert s.loc[("on", 4.0), "hit_rate_measured"] == HIT_ON == s.loc[("on", 8.0), "hit_rate_measured"]
    assert s.loc[("on", 4.0), "hit_rate_expected"] == HIT_ON
    assert s.loc[("off", 8.0), "hit_rate_measured"] == 0.0
    ok = req[req["error"] == ""]
    assert len(req) == 3 * 7 and len(ok) == len(req)  # 6 measured + 1 warm-up per finished point
    assert (ok[~ok["warmup"]]["output_tokens"] == 16).all()
    cached = ok[~ok["warmup"]].groupby("mode")["num_cached_tokens"].unique().map(list).to_dict()
    assert cached == {"off": [0], "on": [1152]}


@pytest.mark.engine
def test_ray_two_cpu_cluster_keeps_both_engines_up_and_takes_turns(ray_study):
    run_dir, _, _ = ray_study
    man = _read_run(run_dir)[0]
    assert man["parallel"] == {"requested": "auto", "used": False, "turns": True, "reason": TURNS_2CPU}
    pts = sorted(man["points"], key=lambda p: p["started_at"])
    assert [(p["mode"], p["rate"]) for p in pts] == [("on", 4.0), ("off", 4.0), ("off", 8.0), ("on", 8.0)]
    # Both engines started, each warmed up (three batches of four at least), before the first point;
    # OFF's replacement after its failed point.
    assert [len(man["engines"][m]) for m in ("on", "off")] == [1, 2]
    for e in (e for es in man["engines"].values() for e in es):
        assert e["warmup"]["stopped"] in ("settled", "max_batches")
        assert e["warmup"]["requests"] == 4 * e["warmup"]["batches"] >= 12
    # One point at a time: each starts once the one before it has ended (a point that failed has no duration).
    ok = [p for p in pts if p["status"] == "ok"]
    for a, b in zip(ok, ok[1:], strict=False):
        assert b["started_at"] >= a["started_at"] + a["duration_s"]


@pytest.mark.engine
def test_killed_engine_actor_fails_its_point_and_the_sweep_goes_on(ray_study):
    run_dir, _, seen = ray_study
    assert seen, "the OFF engine actor was never seen running its 4 req/s point"
    man, req, _, summ = _read_run(run_dir)
    err = summ.set_index(["mode", "rate"]).loc[("off", 4.0), "error"]
    assert err.startswith("ActorDiedError: The actor died unexpectedly") and f"pid {seen['pid']}" in err
    assert "\n" not in err
    assert set(req[req["mode"] == "off"]["rate"]) == {8.0}  # the failed point's rows died with its actor
    engines = man["engines"]
    name = engines["on"][0]["actor"].rsplit("/", 1)[0]
    assert [e["actor"] for e in engines["off"]] == [f"{name}/off", f"{name}/off/restart1"]
    assert len(engines["on"]) == 1 and engines["off"][0]["pid"] == seen["pid"] != engines["off"][1]["pid"]
    # The killed actor's engine processes went with it (the raylet reaps them).
    assert seen["children"]
    deadline = time.monotonic() + 30
    while any(_alive(p) for p in seen["children"]) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not [p for p in seen["children"] if _alive(p)]
    # What it left in the temp folder (its step log, its socket folder) went at its replacement's
    # engine start (engines.ipc.remove_stale): a killed process removes nothing itself.
    assert sorted(p.name for p in Path(tempfile.gettempdir()).glob(f"prefixstudy-*-{seen['pid']}-*")) == []


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


# --------------------------------------------------------------------------- Ray Jobs

@pytest.mark.engine  # the shared Ray head (tests/integration/conftest.py)
@pytest.mark.timeout(300)
def test_ray_job_submit_entrypoint(ray_head, tmp_path):
    """docs/gpus-ray-docker.md's `ray job submit --working-dir . -- prefixstudy run ...`, from a clean copy of the repo."""
    address, env = ray_head.dashboard, ray_head.env
    deadline = time.monotonic() + 120  # the head's job server comes up after its GCS
    while subprocess.run([str(BIN / "ray"), "job", "list", "--address", address], env=env,
                         capture_output=True).returncode != 0:
        assert time.monotonic() < deadline, "the shared head's job server never answered"
        time.sleep(1)
    work = tmp_path / "checkout"  # what a clone holds (a local .venv would be uploaded too)
    for d in ("prefixstudy", "experiments"):
        shutil.copytree(REPO / d, work / d, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", work)

    def submit(*entrypoint: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(BIN / "ray"), "job", "submit", "--address", address, "--working-dir", ".",
                               "--", *entrypoint], cwd=work, env=env, capture_output=True, text=True, timeout=120)

    r = submit("prefixstudy", "run", "seed-a100x8-tp8", "--dry-run")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert ("ok: study seed-a100x8-tp8, 1920 dataset rows, modes on,off, rates 0.5,1,2,4,8,16,24,32,48,64 req/s, "
            "executor ray; nothing run (--dry-run)") in r.stdout
    assert "succeeded" in r.stdout
    # Inside a job, ray.address 'local' joins the job's cluster (RAY_ADDRESS) rather than starting one.
    r = submit("python", "-c", "import ray; from prefixstudy.executors.ray_cluster import connect, alive_nodes; "
                               "print('joined', connect('local'), len(alive_nodes()), ray.cluster_resources()['CPU'])")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert f"joined True 1 {ray_head.cpus:.1f}" in r.stdout  # the head's CPUs, not this machine's


@pytest.mark.engine  # a Ray cluster, though no vLLM engine
@pytest.mark.timeout(180)
def test_a_stopped_mode_frees_its_gpus_for_the_next():
    """On 2 GPUs at TP 2 the modes run one after the other: OFF's placement group can only form
    once ON's is gone.  Ray's logical GPUs stand in for the devices; no engine is started."""
    import asyncio
    from types import SimpleNamespace

    from ray.util.placement_group import placement_group

    from prefixstudy.executors.ray import _ModeRunner

    ray.init(num_cpus=2, num_gpus=2, include_dashboard=False, log_to_driver=False)
    try:
        bundles = [{"GPU": 1, "CPU": 1}] * 2
        on = _ModeRunner(SimpleNamespace(pgs=[]), "on")
        on.pg = placement_group(bundles, strategy="STRICT_PACK")
        on.ex.pgs.append(on.pg)
        assert on.pg.wait(60)
        off_pg = placement_group(bundles, strategy="STRICT_PACK")
        assert not off_pg.wait(2)  # ON holds both GPUs
        asyncio.run(on.stop())
        assert (on.pg, on.ex.pgs) == (None, [])
        assert off_pg.wait(60)
    finally:
        ray.shutdown()


# --------------------------------------------------------------------------- SLO search

@pytest.mark.engine  # the shared Ray head, echo engines
@pytest.mark.timeout(300)
def test_an_slo_search_keeps_each_arm_s_actor_through_its_rounds(ray_address, tmp_path):
    """Side by side on Ray, every round of an SLO search runs on the actors the first round started:
    one engine start per arm, however many rounds.  The search goes on for two rounds at least
    whatever the verdicts (8 met: 16 next; 8 missed or saturated: 4 next, the minimum being 1; 16
    met: its second repeat)."""
    from prefixstudy.study.orchestrate import run_study

    cfg = load_config(None, {"engine": {"kind": "echo", "block_size": 16, "decode_ms_per_token": 5},
                             "executor": "ray", "ray.parallel": "auto", "arrivals.process": "constant",
                             "dataset.prefix_len": 32, "dataset.suffix_len": 16, "dataset.output_len": 2,
                             "sweep.num_requests": 6, "sweep.warmup_requests": 0, "sweep.repeats": 2,
                             "sweep.rates": [8, 16], "sweep.slo": {"objectives": {"e2e_p90": 5000}},
                             "out": str(tmp_path)})
    m = json.loads((run_study(cfg, progress=False) / "manifest.json").read_text())
    assert m["parallel"]["used"] is True and m["status"] == "complete"
    points = {arm: [p for p in m["points"] if p["mode"] == arm] for arm in ("on", "off")}
    assert min(len(p) for p in points.values()) >= 2
    assert {arm: len(e) for arm, e in m["engines"].items()} == {"on": 1, "off": 1}
    assert all(s["stopped"] for s in m["slo_search"]["arms"].values())


@pytest.mark.engine  # a 2-CPU local Ray cluster of its own, echo engines
@pytest.mark.timeout(300)
def test_a_two_cpu_cluster_takes_turns_a_b_b_a_on_one_actor_per_arm_through_an_slo_search(tmp_path):
    """Echo stands in for the default study's CPU engines: 2 CPUs place both actors, not side by
    side, so every point runs alone, A B then B A, as in process; an SLO search's later rounds take
    turns on the same actors."""
    from prefixstudy.study.orchestrate import run_study

    base = {"engine": {"kind": "echo", "block_size": 16, "decode_ms_per_token": 2}, "executor": "ray",
            "ray.address": "local", "ray.num_cpus": 2, "arrivals.process": "constant", "dataset.prefix_len": 32,
            "dataset.suffix_len": 16, "dataset.output_len": 2, "sweep.num_requests": 4, "sweep.warmup_requests": 0,
            "sweep.rates": [50, 100], "sweep.repeats": 2}
    m = json.loads((run_study(load_config(None, {**base, "out": str(tmp_path / "sweep")}), progress=False)
                    / "manifest.json").read_text())
    assert m["parallel"]["turns"] is True and m["parallel"]["used"] is False
    pts = sorted(m["points"], key=lambda p: p["started_at"])
    assert [(p["mode"], p["rate"], p["repeat"]) for p in pts] == [
        ("on", 50.0, 0), ("off", 50.0, 0), ("off", 100.0, 0), ("on", 100.0, 0),
        ("off", 50.0, 1), ("on", 50.0, 1), ("on", 100.0, 1), ("off", 100.0, 1)]
    for a, b in zip(pts, pts[1:], strict=False):
        assert b["started_at"] >= a["started_at"] + a["duration_s"]
    assert {arm: len(e) for arm, e in m["engines"].items()} == {"on": 1, "off": 1}

    slo = {**base, "sweep.rates": [8, 16], "sweep.slo": {"objectives": {"e2e_p90": 5000}}, "out": str(tmp_path / "slo")}
    m = json.loads((run_study(load_config(None, slo), progress=False) / "manifest.json").read_text())
    assert m["parallel"]["turns"] is True and m["status"] == "complete"
    assert min(sum(p["mode"] == arm for p in m["points"]) for arm in ("on", "off")) >= 2
    assert {arm: len(e) for arm, e in m["engines"].items()} == {"on": 1, "off": 1}
