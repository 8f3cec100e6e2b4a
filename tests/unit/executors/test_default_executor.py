"""``executor: auto``: Ray where the engines need a cluster's GPUs, local where they do not (echo
runs in this process, http measures a server that runs elsewhere) unless a Ray cluster is named."""

from __future__ import annotations

import pytest

from prefixstudy.executors import base as executors


@pytest.mark.parametrize(("ray", "kind", "address", "expected"), [
    (True, "vllm", "local", "ray"),
    (True, "vllm-server", "local", "ray"),
    (True, "echo", "local", "local"),
    (True, "http", "local", "local"),
    (True, "http", "10.0.0.1:6379", "ray"),   # a named cluster: the user asked for it
    (True, "echo", "auto", "ray"),
    (False, "vllm", "local", "local"),        # no Ray to use
    (False, "http", "10.0.0.1:6379", "local"),
])
def test_auto(monkeypatch, ray, kind, address, expected):
    monkeypatch.setattr(executors, "ray_installed", lambda: ray)
    assert executors.resolve_executor("auto", kind, address) == expected


@pytest.mark.parametrize("requested", ["local", "ray"])
def test_an_executor_asked_for_is_kept(monkeypatch, requested):
    monkeypatch.setattr(executors, "ray_installed", lambda: False)
    assert executors.resolve_executor(requested, "http") == requested


# (overrides, GPUs here, RAY_ADDRESS, expected): the shipped h200-tp1 (vLLM in process, TP 1, ON and OFF).
@pytest.mark.parametrize(("overrides", "gpus", "env", "expected"), [
    ({}, 1, None, "local"),                                   # one GPU, two arms: they take turns in process
    ({}, 2, None, "ray"),                                     # room for both side by side
    ({}, 0, None, "ray"),                                     # no GPU here: what Ray finds is Ray's to say
    ({"sweep.modes": ["on"]}, 1, None, "ray"),                # one arm: nothing to take turns with
    ({"engine.tensor_parallel_size": 2}, 1, None, "ray"),     # a multi-GPU engine goes through Ray as before
    ({"replicas": 2}, 1, None, "ray"),
    ({"ray.parallel": "on"}, 1, None, "ray"),                 # side by side asked for: Ray refuses it if no room
    ({"ray.address": "10.0.0.1:6379"}, 1, None, "ray"),       # a named cluster
    ({}, 1, "10.0.0.1:6379", "ray"),                          # inside a Ray job
    ({"executor": "ray"}, 1, None, "ray"),                    # asked for
    ({"engine": {"kind": "vllm-server"}}, 1, None, "ray"),    # a server's steps are not timed on the GPU
])
def test_auto_keeps_vllm_in_process_where_ray_would_run_the_arms_one_after_the_other(
        monkeypatch, overrides, gpus, env, expected):
    from prefixstudy.config import load_config
    from prefixstudy.configs import resolve_config
    from prefixstudy.results import provenance

    monkeypatch.setattr(executors, "ray_installed", lambda: True)
    monkeypatch.setattr(provenance, "gpu_count", lambda: gpus)
    if env is None:
        monkeypatch.delenv("RAY_ADDRESS", raising=False)
    else:
        monkeypatch.setenv("RAY_ADDRESS", env)
    cfg = load_config(resolve_config("h200-tp1"), overrides)
    assert executors.executor_of(cfg) == expected
    assert executors.interleaved(cfg) is (expected == "local")
