"""Replicas behind a router on a real two-node Ray cluster on this machine.

``ray.cluster_utils.Cluster`` starts a head (2 CPUs: the router's actor and one replica) and a
second node (1 CPU: the other replica), each its own raylet, as ``ray start --address`` would.
One study, caching ON, two replicas of the tiny vLLM CPU engine routed round robin (deterministic),
three prompt groups; replica 1's actor is SIGKILLed at its first decode step of the 1 req/s point.
Three engine starts (two replicas and replica 1's replacement), about 2-4 minutes on 2 cores.
"""

from __future__ import annotations

import json
import os
import signal
import tempfile
import threading
import time
from pathlib import Path

import pandas as pd
import psutil
import pytest

from prefixstudy.cli import main
from prefixstudy.engines.step_log import read_steps

REPO = Path(__file__).resolve().parents[2]
ARGS = ["--modes", "on", "--rates", "1,2", "--num-requests", "10",
        "--set", "replicas=2", "--set", "router.policies=[round_robin]",
        "--set", "dataset.kind=groups", "--set", "dataset.groups=3", "--set", "dataset.prefix_len=256",
        "--set", "dataset.suffix_len=16", "--set", "dataset.output_len=16", "--set", "sweep.warmup_requests=0",
        "--set", "engine.kv_cache_memory_bytes=134217728", "--set", "engine.enforce_eager=true",
        "--no-report", "--quiet"]


def _kill_replica_during_first_point(out: Path, seen: dict, stop: threading.Event) -> None:
    """SIGKILL replica 1's actor at its first decode step: the cold-start probe and the primes ask
    for one token each, so only a measured request of the first point decodes.  The step log is the
    replica's own file (``engines.ipc.own_step_log``, named for its pid); the pid comes from the
    manifest.  No clock and no Ray call from here: however slow the probe and primes, the kill lands
    in the point."""
    rep = None
    while not stop.is_set():
        time.sleep(0.05)
        if rep is None:
            for m in out.glob("default/*/policy-round_robin/manifest.json"):
                try:
                    engines = json.loads(m.read_text()).get("engines", {}).get("on", [])
                except ValueError:
                    continue
                if engines:
                    rep = engines[0]["replicas"][1]["pid"]
            continue
        try:
            born = psutil.Process(rep).create_time()
        except psutil.NoSuchProcess:
            return
        for log in Path(tempfile.gettempdir()).glob(f"prefixstudy-steps-*-{rep}-*-on.bin"):
            # not a file an earlier process with the same pid left behind
            if log.stat().st_mtime >= born and any(s.decode_tokens > 0 for s in read_steps(str(log))[0]):
                seen["pid"] = rep
                os.kill(rep, signal.SIGKILL)
                return


@pytest.fixture(scope="module")
def fleet_run(tmp_path_factory):
    import ray
    from ray.cluster_utils import Cluster

    out = tmp_path_factory.mktemp("fleet")
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
    worker = cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    nodes = {"head": cluster.head_node.node_id, "worker": worker.node_id}
    seen: dict = {}
    stop = threading.Event()
    killer = threading.Thread(target=_kill_replica_during_first_point, args=(out, seen, stop), daemon=True)
    t0 = time.monotonic()
    killer.start()
    try:
        with pytest.raises(SystemExit) as done:
            main(["run", str(REPO / "prefixstudy/configs/default.yaml"), "--out", str(out),
                  "--ray-address", cluster.address, *ARGS])
    finally:
        stop.set()
        killer.join(15)
        if ray.is_initialized():
            ray.shutdown()
        cluster.shutdown()
    (parent,) = (out / "default").iterdir()
    print(f"fleet study: {time.monotonic() - t0:.0f} s; killed {seen}")
    return parent, done.value.code, seen, nodes


@pytest.mark.engine
@pytest.mark.timeout(900)
def test_each_replica_runs_where_its_placement_group_is(fleet_run):
    parent, code, _, nodes = fleet_run
    man = json.loads((parent / "policy-round_robin/manifest.json").read_text())
    assert man["executor"] == "ray" and man["ray"]["nodes"] == 2 and man["ray"]["replicas"] == 2
    # what the replicas' engines resolved, carried from their actors (vLLM's CPU engine: one step at a time)
    assert [p["async_scheduling"] for p in man["points"]] == [False, False]
    assert man["parallel"]["replica_nodes"] == {"on": [nodes["head"], nodes["worker"]]}  # spread: one per node
    (gen,) = man["engines"]["on"]
    reps = gen["replicas"]
    assert [(r["replica"], r["generation"]) for r in reps] == [(0, 0), (1, 0)]
    assert [r["node_id"] for r in reps] == [r["pg_node_id"] for r in reps] == [nodes["head"], nodes["worker"]]
    # Replica 1's replacement: a new process, on the same placement group's node.
    second = {p["rate"]: p for p in man["points"]}[2.0]["replicas"]
    assert [(r["replica"], r["generation"]) for r in second] == [(0, 0), (1, 1)]
    assert second[1]["pid"] != reps[1]["pid"] and second[1]["node_id"] == second[1]["pg_node_id"] == nodes["worker"]


@pytest.mark.engine
def test_a_killed_replica_fails_only_its_requests_and_the_sweep_goes_on(fleet_run):
    parent, code, seen, _ = fleet_run
    assert seen, "replica 1 was never seen during the first point"
    run = parent / "policy-round_robin"
    req, summ = pd.read_parquet(run / "requests.parquet"), pd.read_csv(run / "summary.csv").set_index("rate")
    assert code == 1  # a failed point: the CLI says so after writing everything
    assert summ.loc[1.0, "status"] == "failed" and summ.loc[2.0, "status"] == "ok"
    assert summ.loc[1.0, "error"].startswith("replica 1 lost during the point: ActorDiedError")
    first = req[(req["rate"] == 1.0) & ~req["warmup"]]
    assert len(first) == 10  # every request is a row, the lost ones too
    failed = first[first["error"] != ""]
    assert len(failed) >= 1 and set(failed["replica"]) == {1}
    assert failed["error"].str.startswith("ReplicaLost: ").all()
    assert (first[first["replica"] == 0]["error"] == "").all()
    assert list(first["replica"]) == [1, 0] * 5  # round robin went on (3 primes took 0, 1, 0)
    assert (run / "routing.md").exists() is False and (parent / "routing.md").exists()
    # The killed replica's step log and socket folder went at its replacement's engine start.
    assert sorted(p.name for p in Path(tempfile.gettempdir()).glob(f"prefixstudy-*-{seen['pid']}-*")) == []


@pytest.mark.engine
def test_round_robin_hits_are_exact_per_replica(fleet_run):
    parent, *_ = fleet_run
    run = parent / "policy-round_robin"
    req = pd.read_parquet(run / "requests.parquet")
    it = pd.read_parquet(run / "iterations.parquet")
    m = req[(req["rate"] == 2.0) & ~req["warmup"]].sort_values("request_index")
    assert (m["error"] == "").all() and (m["output_tokens"] == 16).all()
    # Primes: group 0 -> replica 0, 1 -> 1, 2 -> 0.  Request i (group i % 3) -> replica (3 + i) % 2:
    # the first three miss (their replica has not seen their group yet), every later one hits 256.
    assert list(m["replica"]) == [1, 0] * 5
    assert list(m["num_cached_tokens"]) == [0, 0, 0] + [256] * 7
    assert list(m["expected_cached_tokens"]) == list(m["num_cached_tokens"])
    assert m.groupby("replica")["num_cached_tokens"].sum().to_dict() == {0: 1024, 1: 768}
    summ = pd.read_csv(run / "summary.csv").set_index("rate")
    assert summ.loc[2.0, "hit_rate_measured"] == pytest.approx(1792 / 2720)
    # Each replica keeps its own step series.
    assert set(it[it["rate"] == 2.0]["replica"]) == {0, 1}
    table = pd.read_csv(parent / "replicas.csv")
    t = table[table["rate"] == 2.0].set_index("replica")
    assert t["n_routed"].to_dict() == {0: 5, 1: 5} and t["n_ok"].to_dict() == {0: 5, 1: 5}
    assert t.loc[0, "hit_rate_measured"] == pytest.approx(1024 / 1360)
