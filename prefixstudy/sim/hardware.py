"""Stage: sim.  What the hardware changes: the KV-cache size, and the roofline ratios that carry a
step-cost model fitted on one GPU / TP degree to another.

Roofline time of each cost term on one GPU of a TP group (``roofline_terms``):

* ``c0`` (a step): read every weight once (weights / TP / HBM) + ``2 · layers`` all-reduces' latency
  for TP > 1;
* ``prefill_tokens``: 2 · params FLOPs / TP / peak, + its share of the all-reduces' bytes over NVLink;
* ``decode_tokens``: the same compute and bytes, + reading ``mean_context_tokens`` of KV (when the
  fit has no context term, the decode coefficient carries the average KV read);
* ``context_tokens``: KV bytes per token / TP / HBM.
* ``num_reqs``, ``num_prefill_reqs``: host-side work per request, carried unchanged.

``transfer`` keeps each term's measured efficiency (measured / roofline on the source) and applies
it to the target's roofline; the part of ``c0`` the roofline does not explain (CPU scheduling,
kernel launches) is carried over unchanged.
"""

from __future__ import annotations

from dataclasses import replace

from prefixstudy.model.arch import Arch
from prefixstudy.model.gpus import GPU
from prefixstudy.sim.cost import CostModel

DTYPE_BYTES = 2  # bf16 weights and KV, as every committed study ran
# Per GPU, what vLLM's profile run leaves out of the KV cache besides the weights: peak activations
# of a max_num_batched_tokens forward pass, CUDA graphs, the NCCL buffers.  A round figure for a
# 7B model at 8192 batched tokens; it moves the block count by ~2 %, far from cache pressure.
NON_KV_RESERVE_BYTES = 2 * 2**30
ALLREDUCE_LATENCY_MS = 0.010  # one small all-reduce over NVLink (NCCL ring, latency-bound)


def num_gpu_blocks(arch: Arch, gpu: GPU, tp: int, gpu_memory_utilization: float, block_size: int) -> int:
    """As vLLM sizes it: (memory x utilization - weights - non-KV reserve) per GPU, divided by one
    block's KV bytes on that GPU (each GPU holds 1/TP of the KV heads)."""
    free = gpu.memory_gb * 1e9 * gpu_memory_utilization - arch.total_params * DTYPE_BYTES / tp - NON_KV_RESERVE_BYTES
    per_block = block_size * arch.kv_bytes_per_token(DTYPE_BYTES) / tp
    return max(0, int(free // per_block))


def roofline_terms(arch: Arch, gpu: GPU, tp: int, mean_context_tokens: float) -> dict[str, float]:
    """Roofline milliseconds of each cost term on ``gpu`` at TP ``tp`` (see the module doc)."""
    flops_ms = 2 * arch.total_params / tp / (gpu.bf16_tflops * 1e12) * 1e3
    n_allreduce = 2 * arch.layers  # after attention and after the MLP, every layer
    # Ring all-reduce: each GPU sends and receives 2 (TP-1)/TP of the bytes.
    ar_ms = (n_allreduce * arch.hidden * DTYPE_BYTES * 2 * (tp - 1) / tp) / (gpu.link_gb_s * 1e9) * 1e3
    kv_ms = arch.kv_bytes_per_token(DTYPE_BYTES) / tp / (gpu.hbm_gb_s * 1e9) * 1e3
    weights_ms = arch.total_params * DTYPE_BYTES / tp / (gpu.hbm_gb_s * 1e9) * 1e3
    return {
        "c0": weights_ms + (n_allreduce * ALLREDUCE_LATENCY_MS if tp > 1 else 0.0),
        "prefill_tokens": flops_ms + ar_ms,
        "decode_tokens": flops_ms + ar_ms + mean_context_tokens * kv_ms,
        "context_tokens": kv_ms,
        "num_reqs": 1e-3,  # per-request bookkeeping: host side, the same on every GPU
        "num_prefill_reqs": 1e-3,  # per prefilling request: host side too (metadata, a piecewise graph)
    }


def transfer(model: CostModel, arch: Arch, src: tuple[GPU, int], dst: tuple[GPU, int],
             mean_context_tokens: float) -> CostModel:
    """``model`` (fitted on ``src`` = (gpu, tp)) carried to ``dst``; see the module doc."""
    # With a context term the decode coefficient no longer carries the KV read.
    ctx = 0.0 if "context_tokens" in model.coef_ms else mean_context_tokens
    r_src = roofline_terms(arch, src[0], src[1], ctx)
    r_dst = roofline_terms(arch, dst[0], dst[1], ctx)
    overhead_ms = model.c0_ms - r_src["c0"]
    coef = {t: c * r_dst[t] / r_src[t] for t, c in model.coef_ms.items()}
    note = (f"transferred from {src[0].name} TP {src[1]} to {dst[0].name} TP {dst[1]}: "
            f"c0 = {overhead_ms:.3f} ms overhead + {r_dst['c0']:.3f} ms roofline; terms x roofline ratio")
    return replace(model, c0_ms=overhead_ms + r_dst["c0"], coef_ms=coef, note=note)
