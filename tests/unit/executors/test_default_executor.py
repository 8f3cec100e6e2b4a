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
