"""Fleets on a Ray cluster, planned without one (executors.ray_plan), and the KubeRay manifest."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from prefixstudy.cli import main
from prefixstudy.config import load_config
from prefixstudy.errors import UserError
from prefixstudy.executors import engines_run_here
from prefixstudy.executors.ray_plan import assign_replicas, plan_parallel
from prefixstudy.study.preflight import check_device

REPO = Path(__file__).resolve().parents[2]


def test_replicas_spread_over_nodes_one_per_node_first():
    assert assign_replicas([2, 1], 2) == [0, 1]
    assert assign_replicas([2, 2], 4) == [0, 1, 0, 1]  # ON's fleet [0, 1], OFF's [0, 1]
    assert assign_replicas([1, 4], 3) == [1, 0, 1]  # node 1 has more room: the tie goes to it
    with pytest.raises(UserError, match="no free engine slot for replica 2 of 3"):
        assign_replicas([1, 1], 3)


def test_fleets_side_by_side_only_when_both_fit():
    two_h200 = [{"CPU": 32, "GPU": 2}]
    assert plan_parallel("auto", 2, two_h200, True, 1, 1, replicas=2) == {
        "requested": "auto", "used": False, "turns": False,
        "reason": "auto: the cluster fits 2 engine(s), not 2 fleets of 2; modes run one after the other"}
    assert plan_parallel("auto", 2, [{"CPU": 32, "GPU": 4}], True, 1, 1, replicas=2)["used"] is True
    with pytest.raises(UserError, match="field 'replicas': the Ray cluster has room for 2 engine"):
        plan_parallel("auto", 2, two_h200, True, 1, 1, replicas=3)
    with pytest.raises(UserError, match="--parallel on: the Ray cluster has room for 2 engine"):
        plan_parallel("on", 2, two_h200, True, 1, 1, replicas=2)


def test_h200_replicas_config_dry_run():
    r = CliRunner().invoke(main, ["run", "h200-replicas", "--dry-run"])
    assert r.exit_code == 0, r.output
    assert r.output == ("ok: study h200-replicas, 480 dataset rows, modes on,off, rates 4,16,32 req/s "
                        "x 2 repeats, 2 replicas routed by round_robin,prefix_affinity, executor ray; "
                        "nothing run (--dry-run)\n"
                        "grid: 2 cells over router.policy, each a run folder under one parent: policy-round_robin, "
                        "policy-prefix_affinity\n"
                        "note: cannot run here: field 'device': cuda asked for, but torch sees no "
                        "CUDA GPU here; a Ray cluster's GPUs would do\n")
    cfg = load_config(REPO / "prefixstudy/configs/h200-replicas.yaml")
    assert (cfg.replicas, cfg.engine.tensor_parallel_size, cfg.dataset.groups, cfg.dataset.prefix_len) == (2, 1, 16, 1800)


def test_kuberay_rayjob_manifest(monkeypatch):
    """No RayJob JSON schema is available offline: the fields KubeRay's ray.io/v1 RayJob needs."""
    docs = list(yaml.safe_load_all((REPO / "experiments/kuberay/rayjob.yaml").read_text()))
    assert len(docs) == 1
    job = docs[0]
    assert (job["apiVersion"], job["kind"]) == ("ray.io/v1", "RayJob")
    spec = job["spec"]
    entry = spec["entrypoint"].split()
    assert entry[:3] == ["prefixstudy", "run", "h200-replicas"]
    out = entry[entry.index("--out") + 1]
    assert spec["shutdownAfterJobFinishes"] is True
    cluster = spec["rayClusterSpec"]
    head = cluster["headGroupSpec"]["template"]["spec"]
    mounts = {m["mountPath"]: m["name"] for c in head["containers"] for m in c.get("volumeMounts", [])}
    assert mounts[out] == "results"  # the results land on the volume
    vols = {v["name"]: v for v in head["volumes"]}
    claim = vols["results"]["persistentVolumeClaim"]["claimName"]
    pvc = yaml.safe_load((REPO / "experiments/kuberay/results-pvc.yaml").read_text())
    assert (pvc["kind"], pvc["metadata"]["name"]) == ("PersistentVolumeClaim", claim)
    (gpu,) = cluster["workerGroupSpecs"]
    res = gpu["template"]["spec"]["containers"][0]["resources"]
    assert res["limits"]["nvidia.com/gpu"] == res["requests"]["nvidia.com/gpu"] == "2"
    assert gpu["replicas"] == gpu["minReplicas"] == gpu["maxReplicas"] == 2
    # The study's fleets fit: 2 replicas of TP 1 per mode.
    cfg = load_config(REPO / "prefixstudy/configs/h200-replicas.yaml")
    nodes = [{"CPU": 8, "GPU": 2}] * gpu["replicas"]
    assert plan_parallel(cfg.ray.parallel, 2, nodes, True, cfg.engine.tensor_parallel_size, 1, cfg.replicas)["used"]
    # The entrypoint runs on the head, which has no GPU (nor has this machine), inside the job that
    # `ray job submit` started (RAY_ADDRESS set): the config's `device: cuda` is the cluster's to meet.
    assert entry[entry.index("--ray-address") + 1] == "local" and "--set" not in entry
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    assert cfg.device == "cuda" and not engines_run_here(cfg)
    check_device(cfg)


def test_a_gpu_engine_is_placed_for_its_workers_or_for_its_own_process():
    from prefixstudy.executors.ray_plan import gpu_placement

    # In-process vLLM: one single-GPU bundle per TP rank for vLLM's Ray workers; the actor holds none.
    assert gpu_placement(2, False) == ([{"GPU": 1, "CPU": 1}, {"GPU": 1, "CPU": 1}], {"num_cpus": 1, "num_gpus": 0})
    # vllm-server: one bundle with every GPU, all held by the actor, whose server inherits them.
    assert gpu_placement(4, True) == ([{"GPU": 4, "CPU": 5}], {"num_cpus": 1, "num_gpus": 4, "bundle": 0})
