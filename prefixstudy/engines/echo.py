"""Backend ``echo``: an in-process stand-in that answers with fixed, configurable costs.

It keeps a real prefix cache of block hashes (as vLLM does: whole blocks only, never the last
prompt token), so the runner's accounting, hit-rate checks and results can be tested exactly
without vLLM; with zero costs it answers at once, which is what ``benchmarks/dispatch.py``
measures the arrival loop against.  It is not a performance model: see ``prefixstudy.model``.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Literal

from pydantic import Field

from prefixstudy.engines.base import EngineConfigBase, IterationRecorder, IterationSample, RequestTrace


class EchoEngineConfig(EngineConfigBase):
    kind: Literal["echo"] = "echo"
    block_size: int | None = Field(16, gt=0)
    prefill_ms_per_token: float = Field(0.0, ge=0)  # per prompt token not served from the cache
    decode_ms_per_token: float = Field(0.0, ge=0)


class EchoEngine(IterationRecorder):
    kind = "echo"
    step_timing = "request"  # iteration rows are requests, not engine steps

    def __init__(self, model: str, engine: EchoEngineConfig, mode: str, *, ray_workers: bool = False):
        self.config, self.mode = engine, mode
        self.block_size = engine.block_size or 16
        self.startup_s = 0.0
        self.cache: set[int] = set()
        self.running = 0
        self.dead = False

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
        self.cache.clear()

    def is_dead(self) -> bool:
        return self.dead

    def cached_tokens(self, prompt: list[int]) -> int:
        """Look the prompt's whole blocks up, then cache them all (ON only)."""
        if self.mode != "on":
            return 0
        b, hit, h, missed = self.block_size, 0, 0, False
        for end in range(b, len(prompt) + 1, b):
            h = hash((h, tuple(prompt[end - b:end])))
            if not missed and h in self.cache and end <= len(prompt) - 1:
                hit = end
            else:
                missed = True
            self.cache.add(h)
        return hit

    async def generate(self, prompt_token_ids: list[int], output_len: int, request_id: str,
                       trace: RequestTrace) -> RequestTrace:
        e = self.config
        trace.queued_ts = trace.scheduled_ts = time.monotonic()
        cached = self.cached_tokens(prompt_token_ids)
        self.running += 1
        try:
            await asyncio.sleep(e.prefill_ms_per_token * (len(prompt_token_ids) - cached) / 1e3)
            for _ in range(output_len):
                if e.decode_ms_per_token and trace.token_times:
                    await asyncio.sleep(e.decode_ms_per_token / 1e3)
                trace.token_times.append(time.monotonic())
            if not e.decode_ms_per_token:
                await asyncio.sleep(0)  # yield once, as a real engine's stream would
        finally:
            self.running -= 1
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
