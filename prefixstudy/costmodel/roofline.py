"""Stage: cost model.  The one roofline: what weights read, FLOPs, KV bytes and all-reduces cost on
a GPU, by its datasheet; the work of one engine step and of one request.

Pure arithmetic, no vLLM, torch, pandas or GPU: from an ``Arch`` (``costmodel.arch``,
read from a Hugging Face ``config.json``) and a GPU datasheet entry
(``costmodel.gpus``) it hands on

* the FLOPs, bytes and all-reduces of one engine step (``StepWork``),
* the price of each kind of work on ``tp`` GPUs (``Deployment.compute_ms``, ``memory_ms``,
  ``kv_bytes_per_gpu``, ``ring_ms``, ``allreduce_ms``) and of a whole step (``Deployment.time`` ->
  ``StepTime``),
* the KV-cache blocks that fit beside the weights (``num_gpu_blocks``),
* per-request predictions (prefill, decode step, E2E), the saving from a cached
  prefix and the request-rate ceilings with and without the cache.

Conventions (printed by ``prefixstudy model --explain`` too):

* FLOPs count **2 per multiply-add** (``FLOPS_PER_MAC``), as GPU peak TFLOPS do.
* An engine step is a list of segments ``(new_tokens T, cached_tokens C)``.  Prefill
  of one request is one segment; a decode batch of B requests is B segments of T=1.
* Causal attention: the i-th new token (i = 1..T) attends to C + i keys, so a
  segment attends to ``T*C + T*(T+1)/2`` keys in all; QK^T and AV each cost
  ``heads * head_dim`` multiply-adds per key per layer.
* Logits: vLLM runs lm_head only on the last token of each segment (``all_logits``
  switches to every token, as in training).
* Step time = max(compute, memory) + all-reduce time + fixed overhead, where
  compute = FLOPs/GPU / (peak * mfu) and memory = bytes/GPU / (HBM * bw_eff).
  Bytes are the matmul and lm_head weights (read once per step) plus the K and V
  of every key attended; activations, norms and the embedding lookup are ignored.
* Tensor parallelism divides FLOPs and weight bytes by TP and adds two all-reduces
  per layer of ``tokens * hidden * dtype_bytes`` each, costing the ring term
  ``2 (TP-1)/TP * bytes / link`` plus a fixed latency per call.  The embedding
  all-reduce and the logits gather (one call each per step) are ignored.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

from prefixstudy.costmodel.arch import Arch
from prefixstudy.costmodel.gpus import GPU

FLOPS_PER_MAC = 2


# --------------------------------------------------------------------------- one engine step

@dataclass(frozen=True)
class StepWork:
    """Work of one engine step for the whole model (all TP ranks together)."""

    tokens: float  # new tokens through the projections
    logits_tokens: float  # tokens through lm_head
    attention_keys: float  # sum over new tokens of the keys each attends to
    matmul_flops: float
    lm_head_flops: float
    attention_flops: float
    weight_bytes: float  # matmul + lm_head weights, read once per step
    kv_bytes: float  # K and V of every key attended
    allreduce_bytes: float  # one all-reduce of the hidden states (TP only)
    allreduces: int  # calls per step when TP > 1

    @property
    def flops(self) -> float:
        return self.matmul_flops + self.lm_head_flops + self.attention_flops


def causal_keys(new_tokens: float, cached_tokens: float) -> float:
    """Keys attended by T new tokens on C cached ones: sum_{i=1..T} (C + i)."""
    t, c = new_tokens, cached_tokens
    return t * c + t * (t + 1) / 2


def _work(arch: Arch, tokens: float, logits_tokens: float, keys: float, kv_tokens: float,
          dtype_bytes: int) -> StepWork:
    return StepWork(
        tokens=tokens,
        logits_tokens=logits_tokens,
        attention_keys=keys,
        matmul_flops=FLOPS_PER_MAC * arch.matmul_params * tokens,
        lm_head_flops=FLOPS_PER_MAC * arch.lm_head_params * logits_tokens,
        attention_flops=FLOPS_PER_MAC * 2 * arch.layers * arch.q_dim * keys,  # 2: QK^T and AV
        weight_bytes=(arch.matmul_params + arch.lm_head_params) * dtype_bytes,
        kv_bytes=kv_tokens * arch.kv_bytes_per_token(dtype_bytes),
        allreduce_bytes=tokens * arch.hidden * dtype_bytes,
        allreduces=2 * arch.layers,
    )


def step_work(arch: Arch, segments: Sequence[tuple[float, float]], dtype_bytes: int = 2,
              all_logits: bool = False) -> StepWork:
    """One step over segments ``(new_tokens, cached_tokens)``, batched together."""
    tokens = sum(t for t, _ in segments)
    logits = tokens if all_logits else sum(1 for t, _ in segments if t > 0)
    keys = sum(causal_keys(t, c) for t, c in segments)
    kv_tokens = sum(t + c for t, c in segments)
    return _work(arch, tokens, logits, keys, kv_tokens, dtype_bytes)


def prefill_work(arch: Arch, new_tokens: float, cached_tokens: float = 0, dtype_bytes: int = 2,
                 all_logits: bool = False) -> StepWork:
    return step_work(arch, [(new_tokens, cached_tokens)], dtype_bytes, all_logits)


def decode_work(arch: Arch, batch: float, context_len: float, dtype_bytes: int = 2) -> StepWork:
    """B requests each decoding one token whose context (itself included) is context_len.

    ``batch`` may be fractional (a mean batch size): everything is linear in it.
    """
    return _work(arch, tokens=batch, logits_tokens=batch, keys=batch * context_len,
                 kv_tokens=batch * context_len, dtype_bytes=dtype_bytes)


# --------------------------------------------------------------------------- time on hardware

@dataclass(frozen=True)
class Efficiency:
    """The knobs that turn datasheet peaks into achievable times."""

    mfu: float = 1.0  # achieved / peak FLOPs when compute-bound
    bw_eff: float = 1.0  # achieved / peak HBM bandwidth when memory-bound
    overhead_ms: float = 0.0  # fixed per engine step: scheduler, sampling, launches
    allreduce_latency_us: float = 10.0  # fixed per all-reduce call


PEAK = Efficiency()


@dataclass(frozen=True)
class StepTime:
    compute_ms: float
    memory_ms: float
    comm_ms: float
    overhead_ms: float

    @property
    def total_ms(self) -> float:
        return max(self.compute_ms, self.memory_ms) + self.comm_ms + self.overhead_ms

    @property
    def bound(self) -> str:
        return "compute" if self.compute_ms >= self.memory_ms else "memory"


@dataclass(frozen=True)
class Deployment:
    """A model on ``tp`` GPUs of one kind, with the efficiencies it achieves."""

    arch: Arch
    gpu: GPU
    tp: int = 1
    dtype_bytes: int = 2
    eff: Efficiency = PEAK
    all_logits: bool = False  # lm_head on every prompt token; vLLM: the last one only

    def with_eff(self, eff: Efficiency) -> "Deployment":
        return replace(self, eff=eff)

    def kv_share(self) -> float:
        """Fraction of the KV cache on one GPU (KV heads are replicated when TP > kv_heads)."""
        return max(self.arch.kv_heads / self.tp, 1) / self.arch.kv_heads

    def flops_per_gpu(self, w: StepWork) -> float:
        return w.flops / self.tp

    def bytes_per_gpu(self, w: StepWork) -> float:
        return w.weight_bytes / self.tp + w.kv_bytes * self.kv_share()

    def kv_bytes_per_gpu(self, tokens: float) -> float:
        """K and V of ``tokens`` tokens held (or read) by one GPU."""
        return tokens * self.arch.kv_bytes_per_token(self.dtype_bytes) * self.kv_share()

    def compute_ms(self, flops: float) -> float:
        """``flops`` of the whole model, split over the TP GPUs, at peak x mfu."""
        return flops / self.tp / (self.gpu.bf16_tflops * 1e12 * self.eff.mfu) * 1e3

    def memory_ms(self, nbytes: float) -> float:
        """``nbytes`` read by one GPU at its HBM bandwidth x bw_eff."""
        return nbytes / (self.gpu.hbm_gb_s * 1e9 * self.eff.bw_eff) * 1e3

    def ring_ms(self, nbytes: float) -> float:
        """The bandwidth part of one ring all-reduce: 2 (TP-1)/TP * bytes over the per-direction link."""
        if self.tp == 1:
            return 0.0
        return 2 * (self.tp - 1) / self.tp * nbytes / (self.gpu.link_gb_s * 1e9) * 1e3

    def allreduce_ms(self, nbytes: float) -> float:
        """One ring all-reduce: its bandwidth part plus a fixed latency per call."""
        if self.tp == 1:
            return 0.0
        return self.ring_ms(nbytes) + self.eff.allreduce_latency_us / 1e3

    def time(self, w: StepWork) -> StepTime:
        return StepTime(
            compute_ms=self.compute_ms(w.flops),
            memory_ms=self.memory_ms(self.bytes_per_gpu(w)),
            comm_ms=w.allreduces * self.allreduce_ms(w.allreduce_bytes),
            overhead_ms=self.eff.overhead_ms,
        )

    def ideal_ms(self, flops: float) -> float:
        """FLOPs at the peak of all TP GPUs, nothing else."""
        return flops / (self.tp * self.gpu.bf16_tflops * 1e12) * 1e3


# --------------------------------------------------------------------------- predictions

@dataclass(frozen=True)
class RequestPrediction:
    """One request: prefill of ``new`` tokens on ``cached`` ones, then output_len - 1 decode steps."""

    new_tokens: float
    cached_tokens: float
    output_len: float
    batch: float
    prefill_work: StepWork
    prefill: StepTime
    decode_work: StepWork
    decode_step: StepTime  # at the mean context prompt_len + output_len / 2

    @property
    def decode_ms(self) -> float:
        return max(self.output_len - 1, 0) * self.decode_step.total_ms

    @property
    def e2e_ms(self) -> float:
        return self.prefill.total_ms + self.decode_ms


def predict_request(dep: Deployment, prompt_len: float, cached_len: float, output_len: float,
                    batch: float = 1) -> RequestPrediction:
    """The prefill step makes the first token; each further token is one decode step.

    Decode steps see contexts prompt_len + 1 ... prompt_len + output_len - 1; their
    times are linear in the context within one roofline regime, so output_len - 1
    steps at the mean context prompt_len + output_len/2 give the same sum.
    """
    pw = prefill_work(dep.arch, prompt_len - cached_len, cached_len, dep.dtype_bytes, dep.all_logits)
    dw = decode_work(dep.arch, batch, prompt_len + output_len / 2, dep.dtype_bytes)
    return RequestPrediction(prompt_len - cached_len, cached_len, output_len, batch,
                             pw, dep.time(pw), dw, dep.time(dw))


@dataclass(frozen=True)
class PrefixSaving:
    off: RequestPrediction
    on: RequestPrediction

    @property
    def flops(self) -> float:
        return self.off.prefill_work.flops - self.on.prefill_work.flops

    @property
    def prefill_ms(self) -> float:
        return self.off.prefill.total_ms - self.on.prefill.total_ms


def prefix_saving(dep: Deployment, prefix_len: float, suffix_len: float, output_len: float,
                  batch: float = 1) -> PrefixSaving:
    """Cache OFF: prefill T = P + S on nothing.  Cache ON: T = S on C = P cached tokens."""
    prompt = prefix_len + suffix_len
    return PrefixSaving(off=predict_request(dep, prompt, 0, output_len, batch),
                        on=predict_request(dep, prompt, prefix_len, output_len, batch))


@dataclass(frozen=True)
class RateCeiling:
    """Request rates above which the engine cannot keep up, even with perfect batching.

    Prefill compute cannot be shared between requests, so ``prefill_rps`` = 1 / (prefill
    FLOPs at peak * mfu) bounds the rate.  ``engine_rps`` adds each request's decode FLOPs
    and the bandwidth part of its all-reduces (weight reads and per-call latencies are
    shared by a large batch and drop out).
    """

    prefill_compute_ms: float
    decode_compute_ms: float
    comm_bandwidth_ms: float

    @property
    def engine_ms(self) -> float:
        return self.prefill_compute_ms + self.decode_compute_ms + self.comm_bandwidth_ms

    @property
    def prefill_rps(self) -> float:
        return 1e3 / self.prefill_compute_ms

    @property
    def engine_rps(self) -> float:
        return 1e3 / self.engine_ms


def rate_ceiling(dep: Deployment, prompt_len: float, cached_len: float, output_len: float) -> RateCeiling:
    r = predict_request(dep, prompt_len, cached_len, output_len)
    tokens = r.new_tokens + max(output_len - 1, 0)
    ring_ms = dep.ring_ms(dep.arch.hidden * dep.dtype_bytes * tokens)
    return RateCeiling(
        prefill_compute_ms=r.prefill.compute_ms,
        decode_compute_ms=max(output_len - 1, 0) * r.decode_step.compute_ms,
        comm_bandwidth_ms=2 * dep.arch.layers * ring_ms,
    )


# --------------------------------------------------------------------------- the KV cache

# Per GPU, what vLLM's profile run leaves out of the KV cache besides the weights: peak activations
# of a max_num_batched_tokens forward pass, CUDA graphs, the NCCL buffers.  A round figure for a
# 7B model at 8192 batched tokens; it moves the block count by ~2 %, far from cache pressure.
NON_KV_RESERVE_BYTES = 2 * 2**30


def num_gpu_blocks(dep: Deployment, gpu_memory_utilization: float, block_size: int) -> int:
    """As vLLM sizes it: (memory x utilization - weights - non-KV reserve) per GPU, divided by one
    block's KV bytes on that GPU (each GPU holds 1/TP of the KV heads, at least one)."""
    weights = dep.arch.total_params * dep.dtype_bytes / dep.tp
    free = dep.gpu.memory_gb * 1e9 * gpu_memory_utilization - weights - NON_KV_RESERVE_BYTES
    return max(0, int(free // dep.kv_bytes_per_gpu(block_size)))
