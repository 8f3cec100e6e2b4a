"""vLLM's CPU tier as the in-process engine sees it: its size in offload blocks, and the cached
tokens by tier, counted by vLLM itself.

What ``RequestOutput.num_cached_tokens`` counts under a KV connector (vLLM 0.26.0; 0.32 the same):

* the scheduler looks the prompt up in the GPU prefix cache (``kv_cache_manager.get_computed_blocks``,
  never the last prompt token), then asks the connector for what it holds beyond that
  (``connector.get_num_new_matched_tokens``), v1/core/sched/scheduler.py ``schedule``;
* it records both on the request's first scheduling, before the load has run
  (``request.prefill_stats.set(num_local_cached_tokens, num_external_cached_tokens)``, skipped
  after a preemption: ``num_preemptions <= 0``); the first output carries them
  (``take_prefill_stats``) and the front end sets ``num_cached_tokens`` = local + external
  (v1/engine/output_processor.py), and adds both, apart, to the step's
  ``IterationStats.prompt_token_stats`` (``local_cache_hit``, ``external_kv_transfer``), which the
  stat loggers get and Prometheus exports as ``vllm:prompt_tokens_by_source``;
* the OffloadingConnector's lookup may cover the whole prompt, its last token included
  (offloading/scheduler.py ``_lookup``: ``max_hit_size_tokens = num_tokens`` for full attention);
  vLLM recomputes that token after the load (``_update_waiting_for_remote_kv``: ``num_computed_tokens
  = num_tokens - 1``) but has counted it cached;
* ``AsyncLLM.reset_prefix_cache()`` clears the GPU cache only: the tier is cleared with
  ``reset_connector=True`` (scheduler ``reset_connector_cache``), or for a server with
  ``POST /reset_prefix_cache?reset_external=true``.  A point that starts on the last point's tier
  finds the prompts that point sent; the same dataset rows come back at every rate, so whole
  prompts hit (last token included), above the infinite-cache bound of an empty start.

``TierCounts`` is a stat logger that sums the two sources, so a point's cached tokens by tier come
from the engine's own count.
"""

from __future__ import annotations

from typing import Any


def tier_bytes(vllm_config: Any) -> int:
    """Bytes of host memory given to the native CPU tier (0: none): ``kv_offloading_size`` GiB,
    which vLLM's config turns into the OffloadingConnector's ``cpu_bytes_to_use``."""
    ktc = getattr(vllm_config, "kv_transfer_config", None)
    if ktc is None or getattr(ktc, "kv_connector", None) != "OffloadingConnector":
        return 0
    return int((ktc.kv_connector_extra_config or {}).get("cpu_bytes_to_use") or 0)


def kv_bytes_per_block(vllm_config: Any) -> int:
    """Bytes of one GPU KV block over every layer and every worker, as vLLM's offloading sizes an
    offload block (``worker_kv_bytes_per_block * world_size``, offloading/config.py and
    kv_offload/cpu/spec.py): K and V of each layer on a worker's pipeline stage, its KV heads, for
    ``block_size`` tokens.  Full attention, no MLA (MLA keeps one latent per token)."""
    m, p, c = vllm_config.model_config, vllm_config.parallel_config, vllm_config.cache_config
    dtype = c.cache_dtype
    if dtype in (None, "auto"):
        size = m.dtype.itemsize
    else:
        size = 1 if "fp8" in str(dtype) else 2
    worker = 2 * m.get_num_layers(p) * m.get_num_kv_heads(p) * m.get_head_size() * size * c.block_size
    return worker * p.world_size


def tier_blocks(vllm_config: Any) -> int:
    """Offload blocks in the engine's CPU tier (0: none), one GPU block each (``blocks_per_chunk``
    1 unless ``kv_connector_extra_config`` says otherwise)."""
    from prefixstudy.engines.cachesim import tier_blocks_for

    total = tier_bytes(vllm_config)
    if not total:
        return 0
    extra = vllm_config.kv_transfer_config.kv_connector_extra_config or {}
    chunk = int(extra.get("blocks_per_chunk") or 1)
    if extra.get("block_size"):
        chunk = int(extra["block_size"]) // int(vllm_config.cache_config.block_size)
    return tier_blocks_for(total / (1 << 30), kv_bytes_per_block(vllm_config), chunk)


class TierCounts:
    """Prompt tokens vLLM served from its GPU prefix cache (``local_cache_hit``) and from a KV
    connector (``external_kv_transfer``), summed over the steps it reported.  ``since(mark)``
    gives the sums since a ``mark()``: a point's, when marked at its start."""

    def __init__(self) -> None:
        self.gpu = 0
        self.cpu = 0

    def add(self, iteration_stats: Any) -> None:
        pts = getattr(iteration_stats, "prompt_token_stats", None)
        if pts is None:
            return
        self.gpu += int(pts.local_cache_hit)
        self.cpu += int(pts.external_kv_transfer)

    def mark(self) -> tuple[int, int]:
        return self.gpu, self.cpu

    def since(self, mark: tuple[int, int], has_tier: bool) -> dict[str, int | None]:
        """The point's summary values: cached_tokens_gpu, cached_tokens_cpu (None without a tier)."""
        return {"cached_tokens_gpu": self.gpu - mark[0],
                "cached_tokens_cpu": self.cpu - mark[1] if has_tier else None}


def tier_stat_logger(counts: TierCounts):
    """A vLLM stat logger class that feeds ``counts`` and does nothing else (it stands in for
    vLLM's default loggers: no periodic log line, no Prometheus)."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class TierLogger(StatLoggerBase):
        def __init__(self, vllm_config, engine_index: int = 0):
            pass

        def record(self, scheduler_stats=None, iteration_stats=None, *args, **kwargs):
            if iteration_stats is not None:
                counts.add(iteration_stats)

        def log_engine_initialized(self):
            pass

    return TierLogger
