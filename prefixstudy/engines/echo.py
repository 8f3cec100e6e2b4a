"""Backend ``echo``: an in-process stand-in that answers with fixed, configurable costs.

It keeps a real prefix cache of block hashes (``cachesim.BlockCache``: whole blocks only, never
the last prompt token, generated tokens cached too, and with ``num_blocks`` set a pool of that
many blocks evicted least recently used, as vLLM's; with ``tier_blocks`` a CPU tier of that many
blocks under it, as vLLM's OffloadingConnector keeps one; a cache salt isolating requests as vLLM's
``cache_salt``), so the runner's accounting, hit-rate
checks and results can be tested exactly without vLLM; with zero costs it answers at once, which is what
``benchmarks/dispatch.py`` measures the arrival loop against.  It is not a performance model: see ``prefixstudy.model``.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Literal

from pydantic import Field

from prefixstudy.engines.cachesim import BlockCache
from prefixstudy.engines.base import (EngineConfigBase, EngineDefaults, IterationRecorder, IterationSample, RequestTrace,
                                      caching)


class EchoEngineConfig(EngineConfigBase):
    kind: Literal["echo"] = Field("echo", description="An in-process stand-in with a real block prefix cache "
                                  "and fixed costs; needs neither vLLM nor a GPU.")
    block_size: int | None = Field(16, gt=0, description="Prefix-cache block, in tokens.")
    prefill_ms_per_token: float = Field(0.0, ge=0, description="Milliseconds per prompt token not served from "
                                        "the cache; 0: no prefill cost.")
    decode_ms_per_token: float = Field(0.0, ge=0, description="Milliseconds per generated token; 0: no decode "
                                       "cost.")
    num_blocks: int | None = Field(None, gt=1, description="KV-cache blocks, vLLM's null block included, evicted "
                                   "least recently used; None: unbounded.")
    tier_blocks: int | None = Field(None, gt=0, description="A CPU tier of this many blocks under the cache (LRU, "
                                    "cachesim.OffloadTier); None: none.")
    load_ms_per_block: float = Field(0.0, ge=0, description="Milliseconds per block served from the CPU tier (its "
                                     "load).")
    max_num_seqs: int | None = Field(None, gt=0, description="Requests answered at once at most; the others wait "
                                     "in arrival order (a queue of that many servers, each request's cost its "
                                     "service time); None: every request at once.")
    # No admission_limit: the saturation check's "ran full" rule is for a batch whose every step
    # slows as it fills; echo's servers do not, so only its queue's growth says it saturated.

    def set_capacity(self, unit: str, value: float) -> None:
        self.num_blocks = int(value)  # blocks, its one unit


class EchoEngine(EngineDefaults, IterationRecorder):
    kind = "echo"
    step_timing = "request"  # iteration rows are requests, not engine steps

    def __init__(self, model: str, engine: EchoEngineConfig, mode: str, *, ray_workers: bool = False):
        self.config, self.mode = engine, mode
        self.caching = caching(engine, mode)
        self.block_size = engine.block_size or 16
        self.num_blocks = engine.num_blocks or 0
        self.startup_s = 0.0
        self.cache = BlockCache(self.block_size, engine.num_blocks, engine.tier_blocks or 0)
        self.tier_blocks = engine.tier_blocks or 0  # the runner's cache estimates read it
        self.running = 0
        self._by_tier: list[int] | None = None  # [gpu, cpu] cached tokens of the point's requests
        self.dead = False
        self.slots = asyncio.Semaphore(engine.max_num_seqs) if engine.max_num_seqs else None

    @classmethod
    def check_config(cls, model: str, engine: EchoEngineConfig, modes: list[str]) -> None:
        pass

    @classmethod
    def versions(cls) -> dict[str, Any]:
        return {}

    @classmethod
    def process_env(cls, engine: EchoEngineConfig, mode: str, use_gpu: bool) -> dict[str, str]:
        return {}

    async def start(self) -> None:
        pass

    async def reset_prefix_cache(self) -> None:
        self.cache.clear()  # the tier too: a point starts with both empty

    async def begin_point(self) -> None:
        self._by_tier = [0, 0]

    async def end_point(self) -> dict:
        """The measured requests' cached prompt tokens by tier, as the engine served them (the
        point's metadata: summary's cached_tokens_gpu / cached_tokens_cpu)."""
        gpu, cpu = self._by_tier or (0, 0)
        self._by_tier = None
        return {"cached_tokens_gpu": gpu, "cached_tokens_cpu": cpu if self.tier_blocks else None}

    def is_dead(self) -> bool:
        return self.dead

    @staticmethod
    def output_ids(prompt: list[int], n: int) -> list[int]:
        """What it "generates": tokens of the prompt, picked by the prompt's hash, so the same prompt
        always gives the same output (as greedy decoding does) and every id is a valid one."""
        h = hash(tuple(prompt))
        return [prompt[(h + 7 * i) % len(prompt)] for i in range(n)]

    def cached_tokens(self, prompt: list[int], output: list[int] | None = None) -> int:
        """Look the prompt's whole blocks up, then cache the request's blocks (ON only; without an
        output, the prompt's alone)."""
        return self.cache.run(prompt, output, 1, self.cache_salt) if self.caching else 0

    async def generate(self, prompt_token_ids: list[int], output_len: int, request_id: str,
                       trace: RequestTrace) -> RequestTrace:
        trace.queued_ts = time.monotonic()
        if self.slots is None:
            return await self._answer(prompt_token_ids, output_len, trace)
        async with self.slots:  # FIFO: asyncio wakes its waiters in the order they came
            return await self._answer(prompt_token_ids, output_len, trace)

    async def _answer(self, prompt_token_ids: list[int], output_len: int, trace: RequestTrace) -> RequestTrace:
        e = self.config
        trace.scheduled_ts = time.monotonic()
        output = self.output_ids(prompt_token_ids, output_len)
        # Blocks are held while the request runs (pinned, as in vLLM), freed when it ends.
        # A cache salt (set_cache_salt) enters the blocks' hashes, as vLLM's cache_salt does.
        cached, held = self.cache.start(prompt_token_ids, output, 1, self.cache_salt) if self.caching else (0, [])
        from_tier = self.cache.last_tier_hit if self.caching else 0
        if self._by_tier is not None:
            self._by_tier[0] += cached - from_tier
            self._by_tier[1] += from_tier
        self.running += 1
        try:
            await asyncio.sleep((e.prefill_ms_per_token * (len(prompt_token_ids) - cached)
                                 + e.load_ms_per_block * (from_tier // self.block_size)) / 1e3)
            for _ in range(output_len):
                if e.decode_ms_per_token and trace.token_times:
                    await asyncio.sleep(e.decode_ms_per_token / 1e3)
                trace.token_times.append(time.monotonic())
                trace.output_token_ids.append(output[len(trace.token_times) - 1])
            if not e.decode_ms_per_token:
                await asyncio.sleep(0)  # yield once, as a real engine's stream would
        finally:
            self.running -= 1
            self.cache.finish(held)
        trace.num_cached_tokens = cached
        trace.first_token_ts, trace.last_token_ts = trace.token_times[0], trace.token_times[-1]
        if self.samples is not None:  # no steps here: one sample per request, its whole span
            n = len(prompt_token_ids)
            self.samples.append(IterationSample(
                trace.scheduled_ts, time.monotonic(), n - cached, cached, n, output_len - 1, n + output_len,
                1, 1, output_len, self.running, 0, 0.0))
        return trace

    def shutdown(self) -> None:
        self.cache.clear()
