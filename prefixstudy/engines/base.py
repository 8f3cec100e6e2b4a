"""Stage: engines.  Who answers the requests: the protocol every backend implements.

The runner drives an engine through this protocol only:

    start() → (reset_prefix_cache() → begin_point() → begin_iterations() → generate(...)*
               → end_point() → end_iterations())* → aclose() → shutdown()

and never sees vLLM, HTTP or a simulator behind it.  A backend is one file in this package with a
class implementing ``Engine`` (``EngineDefaults`` gives the parts it may leave out) and a pydantic
config class with a ``kind`` (``EngineConfigBase``), named with what it can do in
``prefixstudy.engines.registry.BACKENDS`` (the study config's union is built from it).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr


class EngineConfigBase(BaseModel):
    """What every backend's config has: the fields that stages besides the engine read
    (dataset checks read ``max_model_len``; executors place ``tensor_parallel_size`` devices)."""

    model_config = ConfigDict(extra="forbid")
    kind: str = Field(description="The backend: `vllm` (in process), `echo` (a stand-in), `http` (a running "
                      "server), `vllm-server` (`vllm serve` launched per arm), `sglang-server` (SGLang's server "
                      "launched per arm) or `sim` (the simulator).")
    max_model_len: int = Field(2048, gt=0, description="Longest prompt + output, in tokens, the engine takes; "
                               "every dataset row is checked against it before a run.")
    tensor_parallel_size: int = Field(1, ge=1, description="GPUs one engine spans (tensor parallel); the Ray "
                                      "executor reserves that many on one node.")
    block_size: int | None = Field(None, gt=0, description="Prefix-cache block, in tokens; None: the backend's "
                                   "default (http: read from the server's /metrics).")
    # The arm's caching, set on the engine config an arm's engine is built from
    # (prefixstudy.config.arms.arm_engine): resolved state, not a field a config can hold or a dump writes.
    _prefix_caching: bool | None = PrivateAttr(None)

    @property
    def resident_share(self) -> float | None:
        """The share of its device one engine of this config holds while it is up (vLLM's
        ``gpu_memory_utilization``); None: none, or not ours to know; 1.0: the whole device (an engine
        that sizes itself by the memory free when it starts).  Interleaved arms keep every arm's engine
        up at once, and the plan check refuses shares that cannot fit together."""
        return None

    @property
    def admission_limit(self) -> int | None:
        """Requests one engine runs at once at most (vLLM's ``max_num_seqs``); None: none, or not
        known.  The saturation check's "ran full" rule reads it (metrics.saturation)."""
        return None

    def salt_refusal(self) -> str:
        """Why this config's requests cannot take a cache salt although its backend can ("": they
        can); preflight refuses ``sweep.cache_isolation: salt`` with it."""
        return ""

    def set_capacity(self, unit: str, value: float) -> None:
        """Size the KV cache to ``value`` ``unit``s: a unit of the backend's ``capacity_units``
        (engines.registry) other than a CPU tier's; prefixstudy.sweep.capacity_axis sweeps it."""
        raise NotImplementedError(f"engine.kind {self.kind} takes no capacity in {unit}")


@dataclass
class RequestTrace:
    """What one request produced: client clocks (time.monotonic) and the engine's own stamps
    (NaN where a backend has none)."""

    sent_mono: float
    token_times: list[float] = field(default_factory=list)  # one entry per generated token
    num_cached_tokens: int = 0
    queued_ts: float = float("nan")
    scheduled_ts: float = float("nan")
    first_token_ts: float = float("nan")
    last_token_ts: float = float("nan")
    error: str = ""
    # The generated token ids: a later turn of a session puts them in its prompt, and the cache
    # estimate hashes them.  Kept in memory only (not a results column).
    output_token_ids: list[int] = field(default_factory=list)
    replica: int = 0  # which replica of the mode's fleet answered (engines.fleet); 0 for one engine
    # Tokens the server counted (usage.completion_tokens) beyond the ones it streamed: their arrival
    # times are unknown, so the per-token gaps (ITL) are not measured for this request.
    unstreamed_tokens: int = 0
    # False: the backend's answer carried no cached-token count (a server started without its flag),
    # so ``num_cached_tokens`` 0 says nothing about the cache.
    cached_tokens_reported: bool = True


@dataclass
class IterationSample:
    """One engine step, on the engine host's monotonic clock.  ``start_mono`` is never before the
    previous step's ``end_mono``, and idle time is never inside a step (see engines.vllm_steps)."""

    start_mono: float
    end_mono: float
    prefill_tokens: int  # prompt tokens computed in this step
    cached_tokens: int  # prompt tokens served from the prefix cache to requests first scheduled here
    queried_tokens: int  # prompt tokens of the requests first scheduled here (looked up in the cache)
    decode_tokens: int  # tokens computed for requests past their prompt
    context_tokens: int  # KV tokens the scheduled requests attend to, after this step
    num_prefill_reqs: int
    num_decode_reqs: int
    sampled_tokens: int  # requests that sampled a token (decoding, or prompt finished)
    num_running: int
    num_waiting: int
    kv_cache_usage: float  # 0..1
    gpu_ms: float = float("nan")  # the step's span on the GPU (engines.vllm_gpu_timer); NaN: not timed there
    replica: int = 0  # which replica of the mode's fleet took the step (engines.fleet)


class IterationRecorder:
    """The iteration half of the protocol for a backend that gets samples pushed to it: append to
    ``self.samples`` while it is a list (recording), ignore them while it is None."""

    samples: list[IterationSample] | None = None

    def begin_iterations(self) -> None:
        self.samples = []

    def end_iterations(self) -> list[IterationSample]:
        out, self.samples = self.samples or [], None
        return out


class Engine(Protocol):
    """One mode's engine.  ``block_size``, ``num_blocks`` (KV-cache blocks; 0: unknown or unbounded)
    and ``startup_s`` are known once ``start`` returns.

    Built as ``cls(model, engine_config, mode, ray_workers=...)``: a backend sees the model and its
    own config section, nothing else of the study."""

    kind: ClassVar[str]
    step_timing: str  # the `timing` of its iteration rows, known once ``start`` returns
    tier_blocks: int  # the runner's cache estimate models a CPU tier of this many blocks (0: none)
    block_size: int
    num_blocks: int
    startup_s: float

    @classmethod
    def check_config(cls, model: str, engine: EngineConfigBase, modes: list[str]) -> None:
        """Refuse what this backend would refuse at start, before any results folder exists
        (raise UserError naming the field)."""

    @classmethod
    def versions(cls) -> dict[str, Any]:
        """What the manifest records about this backend (package versions)."""

    @classmethod
    def process_env(cls, engine: EngineConfigBase, mode: str, use_gpu: bool) -> dict[str, str]:
        """Environment a process hosting this engine needs (executors that start processes set it)."""

    async def start(self) -> None: ...

    async def reset_prefix_cache(self) -> bool | None:
        """Empty the prefix cache (a CPU tier too).  False: the engine has no reset (a server
        without its endpoint; it warns); True or None: reset."""

    def begin_iterations(self) -> None:
        """Forget earlier iteration samples and record from now on."""

    def end_iterations(self) -> list[IterationSample]:
        """Stop recording; hand over the samples since ``begin_iterations``."""

    async def generate(self, prompt_token_ids: list[int], output_len: int, request_id: str,
                       trace: RequestTrace) -> RequestTrace:
        """Run one request, filling ``trace`` as tokens arrive (a cancelled request keeps what it got)."""

    async def begin_point(self) -> None:
        """Right before a point's measured requests."""

    def set_cache_salt(self, salt: str) -> None:
        """Salt every request from now on (vLLM's per-request ``cache_salt``): prompts under another
        salt share no cached block.  Asked only of backends whose registry entry declares
        ``cache_salt``."""

    async def probe(self, prompt_token_ids: list[int], request_id: str) -> list[RequestTrace]:
        """Send ``prompt_token_ids`` for one output token to every prefix cache the engine has
        (a fleet: each replica, bypassing its router); one trace each.  The runner's cold-start
        probe (runner.cold), never a measured request."""

    async def end_point(self) -> dict[str, Any]:
        """Right after them (before ``end_iterations``): keys for the point's metadata."""

    async def aclose(self) -> None:
        """Before ``shutdown``, on the loop the engine ran on."""

    def pool_key(self) -> str | None:
        """What the engine is, for an ``EnginePool`` to keep it for a later study; None: never kept."""

    def is_dead(self) -> bool: ...

    def shutdown(self) -> None: ...


class EngineDefaults:
    """The parts of ``Engine`` a backend may leave out, and what leaving them out means."""

    step_timing: str = "engine"  # the `timing` of its iteration rows (engines.step_log.TIMING_METHODS)
    tier_blocks: int = 0  # blocks of a CPU tier under its cache, known once started; 0: none (or not known)
    cache_salt: str = ""  # the salt of every request (set_cache_salt); "": none
    # Whether the engine schedules step N+1 while step N runs (vLLM's async scheduling), as the engine
    # resolved it, known once started; None: the backend does not say.
    async_scheduling: bool | None = None

    def set_cache_salt(self, salt: str) -> None:
        """Kept for ``generate`` to send; a backend whose requests take a salt reads ``cache_salt``."""
        self.cache_salt = salt

    async def probe(self, prompt_token_ids: list[int], request_id: str) -> list[RequestTrace]:
        """One engine, one cache: the prompt sent once, as any request."""
        trace = RequestTrace(time.monotonic())
        await self.generate(prompt_token_ids, 1, request_id, trace)
        return [trace]

    async def begin_point(self) -> None:
        """Nothing to do before the measured requests (HTTP scrapes the server's counters here)."""

    async def end_point(self) -> dict[str, Any]:
        """No metadata of its own for the point (HTTP: the counters' difference)."""
        return {}

    async def aclose(self) -> None:
        """Nothing to close on the engine's loop (HTTP: its connection pool)."""

    def pool_key(self) -> str | None:
        """Never kept by an ``EnginePool`` (in-process vLLM engines are)."""
        return None


def caching(engine, mode: str) -> bool:
    """Prefix caching of an engine built for ``mode``: the arm's when resolved, else by the
    built-in name (anything but ``off`` caches)."""
    flag = getattr(engine, "_prefix_caching", None)
    return flag if flag is not None else mode != "off"
