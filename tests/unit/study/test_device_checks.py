"""Where the engines run decides which machine's devices a study is checked against.

This machine has no CUDA GPU.  A GPU study is refused here when its engines would run here (the
local executor, or a Ray cluster the run starts on this machine), and left to the Ray executor when
the run joins a cluster (``ray.address``, or RAY_ADDRESS set as inside a Ray job): a KubeRay head
runs the driver and has no GPU, its workers do (docs/kuberay.md).
"""

from __future__ import annotations

import pytest

from prefixstudy.config import load_config
from prefixstudy.configs import resolve_config
from prefixstudy.errors import UserError
from prefixstudy.executors import engines_run_here
from prefixstudy.study.preflight import check_device, check_offload_device

NO_GPU = "field 'device': cuda asked for, but torch sees no CUDA GPU here"


@pytest.mark.parametrize("overrides, env, here", [
    ({"executor": "local"}, None, True),
    ({"executor": "ray"}, None, True),  # `ray.address: local` starts the cluster on this machine
    ({"executor": "ray"}, "10.0.0.1:6379", False),  # as `ray job submit` sets it for the entrypoint
    ({"executor": "ray", "ray.address": "10.0.0.1:6379"}, None, False),
    ({"executor": "local"}, "10.0.0.1:6379", True),  # the local executor ignores Ray
])
def test_a_gpu_study_is_refused_here_only_when_its_engines_would_run_here(overrides, env, here, monkeypatch):
    if env is None:
        monkeypatch.delenv("RAY_ADDRESS", raising=False)
    else:
        monkeypatch.setenv("RAY_ADDRESS", env)
    cfg = load_config(resolve_config("h200-tp1"), overrides)
    assert cfg.device == "cuda"
    assert engines_run_here(cfg) is here
    if here:
        with pytest.raises(UserError, match=f"^{NO_GPU}$"):
            check_device(cfg)
    else:
        check_device(cfg)


def test_an_offload_arm_is_refused_here_only_when_its_engines_would_run_here(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    cfg = load_config(resolve_config("h200-offload"), {"executor": "ray", "device": "auto"})
    with pytest.raises(UserError, match=r"^field 'arms\.\d+\.offload': vLLM's KV offloading connector runs on CUDA"):
        check_offload_device(cfg)
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    check_offload_device(cfg)  # the cluster's GPUs: not known before it is joined
    with pytest.raises(UserError, match=r"this machine's engines run on the CPU"):
        check_offload_device(cfg, "cpu")  # what the cluster's nodes turned out to be
