"""Stage: cost model.  Carrying a step cost fitted on one model, GPU and TP degree to another, by the
ratio of each term's roofline time on the two (priced by ``costmodel.roofline``'s ``Deployment``).

Roofline time of each cost term on one GPU of a TP group (``roofline_terms``; P = the decoder
layers' projection weights, V·h = lm_head, L layers, hidden h):

* ``c0`` (a step): a step with no tokens: it reads the weights once, (P + V·h) · 2 B / TP / HBM, and
  makes ``2 · L`` all-reduce calls (their latency, for TP > 1);
* ``prefill_tokens``: 2 · P FLOPs / TP / peak (lm_head runs on a prompt's last token only), + the
  ring all-reduce bytes of ``2 · L`` all-reduces of h · 2 B over the link;
* ``decode_tokens``: 2 · (P + V·h) FLOPs / TP / peak, the same all-reduce bytes, + reading
  ``mean_context_tokens`` of KV (when the fit has no context term, the decode coefficient carries
  the average KV read);
* ``context_tokens``: KV bytes per token on one GPU (1/TP of the KV heads, at least one head) / HBM;
* ``num_prefill_reqs``: a prefilling request's fixed cost is host and launch work (attention
  metadata, the layers run outside the full CUDA graph), done once per layer: ``L`` units, the same
  on every GPU and TP degree;
* the derived terms of a piecewise GPU part (``costmodel.step.term_getter``) as the work they are: a
  segment of the GEMM rows as ``prefill_tokens``, ``prompt_step`` as ``num_prefill_reqs``, and
  ``kv_tokens`` (the KV a step holds) as ``context_tokens``.

The deployments are priced at their efficiencies; callers pass the datasheet peaks (``PEAK``), so
only ratios of peaks enter.

``transfer`` keeps each term's measured efficiency (measured / roofline on the source) and applies
it to the target's roofline, so each coefficient is multiplied by ``roofline(target) /
roofline(source)``; the part of ``c0`` the roofline does not explain (CPU scheduling, sampling,
kernel launches) is carried over unchanged.  The host part of a default-engine calibration
(``CostModel.host``: the host's launch of each step, ``costmodel.step_cost.fit_host_paired``, or a floor under each
step, ``costmodel.step_cost.fit_host``) is carried the same way: each term by the GPU part's ratio, its fixed cost
beyond the source's roofline kept; a term only the host has (``prefix_queries``, the prompt tokens it
hashes) unchanged.  A launch measured from host stamps may hold waits on the GPU too: between one H200
and one H100 (experiments/sim/gpu_transfer.py) this rule prices the other machine's default engine
closer than carrying the launch unchanged, but two machines cannot tell a host's speed from its GPU's,
and the target's host is not measured: an assumption, not a measurement.  ``extrapolations`` names
what the calibration's data cannot check about such a transfer.
"""

from __future__ import annotations

from dataclasses import replace

from prefixstudy.costmodel.arch import Arch
from prefixstudy.costmodel.roofline import FLOPS_PER_MAC, Deployment, step_work
from prefixstudy.costmodel.step_cost import CostModel
from prefixstudy.costmodel.step import ROW_TERMS

# Beyond this ratio of weights either way, the GEMMs run at shapes whose efficiency the calibration
# never measured.
SIZE_RATIO_CHECKED = 2.0


def roofline_terms(dep: Deployment, mean_context_tokens: float) -> dict[str, float]:
    """Roofline milliseconds of each cost term for ``dep`` (see the module doc)."""
    arch = dep.arch
    n_allreduce = 2 * arch.layers  # after attention and after the MLP, every layer
    ar_ms = n_allreduce * dep.ring_ms(arch.hidden * dep.dtype_bytes)  # one token's hidden state, each call
    kv_ms = dep.memory_ms(dep.kv_bytes_per_gpu(1))
    return {
        "c0": dep.time(step_work(arch, [], dep.dtype_bytes)).total_ms,
        "prefill_tokens": dep.compute_ms(FLOPS_PER_MAC * arch.matmul_params) + ar_ms,
        "decode_tokens": dep.compute_ms(FLOPS_PER_MAC * (arch.matmul_params + arch.lm_head_params)) + ar_ms
                         + mean_context_tokens * kv_ms,
        "context_tokens": kv_ms,
        "num_prefill_reqs": float(arch.layers),  # host-side units (module doc): only ratios are used
    }


# The derived terms (``costmodel.step.term_getter``) scale as the roofline term whose work they are: a
# segment of a step's GEMM rows as a prompt token's GEMMs, a step that computes a prompt as a prompt
# request's fixed cost, the KV a step holds as the KV a token attends.
ROOFLINE_OF = {**dict.fromkeys(ROW_TERMS, "prefill_tokens"), "prompt_step": "num_prefill_reqs",
               "kv_tokens": "context_tokens"}


def same_model(a: Arch, b: Arch) -> bool:
    """The same architecture, whatever its folder or name says."""
    return replace(a, name="") == replace(b, name="")


def priced(model: str, a: Arch, gpu: str, tp: int) -> dict:
    """What a cost model prices, as the manifest and cost_model.json record it."""
    return {"model": model, "arch": a.name, "params": a.total_params, "layers": a.layers, "hidden": a.hidden,
            "heads": a.heads, "kv_heads": a.kv_heads, "head_dim": a.head_dim, "gpu": gpu, "tp": tp}


def extrapolations(src: Arch, dst: Arch) -> list[str]:
    """What a transfer from ``src`` to ``dst`` assumes that the calibration's steps cannot check,
    one sentence each (empty for the same model)."""
    out = []
    ratio = (dst.matmul_params + dst.lm_head_params) / (src.matmul_params + src.lm_head_params)
    if not 1 / SIZE_RATIO_CHECKED <= ratio <= SIZE_RATIO_CHECKED:
        out.append(f"the target has {ratio:.2f}x the calibration model's weights: its GEMMs run at shapes "
                   f"whose efficiency was not measured")
    g_src, g_dst = src.heads // src.kv_heads, dst.heads // dst.kv_heads
    if (g_src, src.head_dim) != (g_dst, dst.head_dim):
        out.append(f"attention layout differs (query heads per KV head {g_dst} vs {g_src}, head_dim "
                   f"{dst.head_dim} vs {src.head_dim}): the attention kernels' efficiency is carried "
                   f"from another layout")
    return out


def transfer(model: CostModel, src: Deployment, dst: Deployment, mean_context_tokens: float) -> CostModel:
    """``model`` (fitted on ``src``) carried to ``dst``; see the module doc.  Its ``transfer`` record
    holds what was multiplied: each term's roofline ratio (``scale``: ``c0`` for the roofline part
    of the step's fixed cost) and the overhead carried unchanged (``c0_overhead_ms``)."""
    # With a context or KV term the decode coefficient no longer carries the KV read.
    ctx = 0.0 if {"context_tokens", "kv_tokens"} & set(model.coef_ms) else mean_context_tokens
    r_src, r_dst = roofline_terms(src, ctx), roofline_terms(dst, ctx)
    overhead_ms = model.c0_ms - r_src["c0"]
    scale = {"c0": r_dst["c0"] / r_src["c0"],
             **{t: r_dst[ROOFLINE_OF.get(t, t)] / r_src[ROOFLINE_OF.get(t, t)] for t in model.coef_ms}}
    host = model.host
    if host:  # a term of the host's own (the prompt tokens it hashes) is host work: the same on any GPU
        scale |= {t: r_dst[t] / r_src[t] if t in r_src else 1.0 for t in host["coef_ms"]}
        host = {**host, "c0_ms": host["c0_ms"] - r_src["c0"] + r_dst["c0"],
                "coef_ms": {t: c * scale[t] for t, c in host["coef_ms"].items()}}
    note = (f"transferred from {src.arch.name} on {src.gpu.name} TP {src.tp} to {dst.arch.name} on "
            f"{dst.gpu.name} TP {dst.tp}: c0 = {overhead_ms:.3f} ms overhead + {r_dst['c0']:.3f} ms roofline; "
            f"terms x roofline ratio")
    return replace(model, c0_ms=overhead_ms + r_dst["c0"], coef_ms={t: c * scale[t] for t, c in model.coef_ms.items()},
                   host=host, note=note, transfer={**model.transfer, "scale": scale, "c0_overhead_ms": overhead_ms,
                                        "mean_context_tokens": ctx})
