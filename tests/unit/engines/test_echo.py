"""The echo backend: a real prefix cache of whole blocks, as vLLM keeps one, with no vLLM."""

import asyncio

from prefixstudy.config import load_config
from prefixstudy.engines import BACKENDS, RequestTrace, engine_class
from prefixstudy.runner.engine_build import make_engine


def echo(mode, **engine):
    cfg = load_config(None, {"engine": {"kind": "echo", "block_size": 16, **engine}})
    return make_engine(cfg, mode)


def test_cache_serves_whole_blocks_and_never_the_last_token():
    e = echo("on")
    p40 = list(range(100, 140))
    assert e.cached_tokens(p40) == 0  # first sight: nothing cached, both whole blocks stored
    assert e.cached_tokens(p40) == 32  # tokens 0..31; the 8 after the last whole block are computed
    assert e.cached_tokens(p40[:32]) == 16  # all 32 cached, but the last token must be computed
    assert e.cached_tokens(p40[:16] + [7] * 24) == 16  # shares the first block only
    assert e.cached_tokens([7] * 16 + p40[16:]) == 0  # a block is keyed by everything before it
    asyncio.run(e.reset_prefix_cache())
    assert e.cached_tokens(p40) == 0


def test_off_never_hits():
    e = echo("off")
    p = list(range(100, 164))
    assert [e.cached_tokens(p) for _ in range(3)] == [0, 0, 0]


def test_generate_fills_the_trace_and_iteration_samples():
    async def go():
        e = echo("on")
        await e.start()
        e.begin_iterations()
        await e.generate(list(range(100, 150)), 5, "a", RequestTrace(0.0))
        tr = await e.generate(list(range(100, 150)), 5, "b", RequestTrace(0.0))
        return tr, e.end_iterations(), e.end_iterations()

    tr, samples, again = asyncio.run(go())
    assert (len(tr.token_times), tr.num_cached_tokens, tr.error) == (5, 48, "")
    assert tr.queued_ts <= tr.scheduled_ts <= tr.first_token_ts <= tr.last_token_ts
    # echo has no steps: one sample per request (queried, cached, prefill, decode, sampled tokens)
    assert [(s.queried_tokens, s.cached_tokens, s.prefill_tokens, s.decode_tokens, s.sampled_tokens)
            for s in samples] == [(50, 0, 50, 4, 5), (50, 48, 2, 4, 5)]
    assert again == []  # handed over once


def test_backends_table_names_importable_classes():
    kinds = ["echo", "http", "sglang-server", "sim", "vllm", "vllm-server"]
    assert sorted(BACKENDS) == kinds
    assert [engine_class(k).kind for k in sorted(BACKENDS)] == kinds
