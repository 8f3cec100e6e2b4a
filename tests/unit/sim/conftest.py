"""One resolved VllmConfig for the simulator tests: resolving it (and importing vLLM) takes
seconds, building a scheduler from it takes milliseconds."""

from __future__ import annotations

import pytest

from pathlib import Path

REPO = Path(__file__).resolve().parents[3]

TINY = str(REPO / "prefixstudy/configs/models/tiny-llama")


@pytest.fixture(scope="session")
def tiny_vllm_config():
    from prefixstudy.sim.vllm_setup import SchedulerSpec, vllm_config

    return vllm_config(SchedulerSpec(model_dir=TINY, prefix_caching=True, num_gpu_blocks=64, block_size=16))


@pytest.fixture
def make_sim(tiny_vllm_config):
    """make_sim(mode, num_gpu_blocks, cost_ms, async_scheduling) -> Simulator on the tiny Llama, 16-token
    blocks; with ``async_scheduling`` vLLM's AsyncScheduler, which the driver pipelines."""
    from prefixstudy.costmodel.arch import load_arch
    from prefixstudy.sim.driver import Simulator
    from prefixstudy.sim.vllm_setup import SchedulerSpec, build_scheduler

    def make(mode: str = "on", num_gpu_blocks: int = 64, cost_ms=None, async_scheduling: bool = False):
        spec = SchedulerSpec(model_dir=TINY, prefix_caching=mode == "on", num_gpu_blocks=num_gpu_blocks, block_size=16,
                             async_scheduling=async_scheduling)
        sched, hasher = build_scheduler(spec, load_arch(TINY), tiny_vllm_config)
        return Simulator(sched, hasher, cost_ms or unit_cost_ms)

    return make


def unit_cost_ms(f) -> float:
    """1 ms a step, 0.01 ms a prompt token, 0.1 ms a decode token: easy to add up by hand."""
    return 1.0 + 0.01 * f.prefill_tokens + 0.1 * f.decode_tokens
