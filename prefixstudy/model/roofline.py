"""Stage: model.  First-principles arithmetic beside the measurement pipeline.

Pure arithmetic, no vLLM, torch or GPU: it reads a Hugging Face ``config.json``
and a GPU datasheet entry (``prefixstudy.gpus``) and hands on

* parameter counts and KV-cache bytes per token (``Arch``),
* the FLOPs, bytes and all-reduces of one engine step (``StepWork``),
* a roofline time for that step on ``tp`` GPUs (``Deployment.time`` -> ``StepTime``),
* per-request predictions (prefill, decode step, E2E), the saving from a cached
  prefix and the request-rate ceilings with and without the cache,
* a fit of the efficiencies to a measured study and the per-point comparison
  (``calibrate``, ``model_vs_measurement``) that the report shows.

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

import json
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from prefixstudy.errors import UserError, read_text
from prefixstudy.model.gpus import GPU, find_gpu, load_gpus

if TYPE_CHECKING:  # pandas and matplotlib are only needed by the calibration half
    import pandas as pd
    from matplotlib.figure import Figure

FLOPS_PER_MAC = 2
SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4}

# The reported case of issue 4: Mistral-7B-v0.3 on 8 x A100-SXM4-40GB, TP 8.
REPORTED_CASE = dict(
    config_json="experiments/models/mistral-7b-v0.3/config.json",
    gpu="A100-SXM4-40GB", tp=8, prompt_len=1214, prefix_len=1198, output_len=143,
    observed_off_ms=115.35, observed_on_ms=94.56,  # mean client E2E at 1 req/s
)


# --------------------------------------------------------------------------- architecture

@dataclass(frozen=True)
class Arch:
    """A dense decoder (Llama / Mistral / Qwen2): GQA attention, SwiGLU MLP."""

    name: str
    model_type: str
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied_embeddings: bool = False
    qkv_bias: bool = False  # Qwen2: counted as parameters, ignored in FLOPs
    mlp_bias: bool = False

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def attn_params_per_layer(self) -> int:
        """q, k, v and o projection weights."""
        return 2 * self.hidden * self.q_dim + 2 * self.hidden * self.kv_dim

    @property
    def mlp_params_per_layer(self) -> int:
        """gate, up and down projection weights (SwiGLU)."""
        return 3 * self.hidden * self.intermediate

    @property
    def matmul_params(self) -> int:
        """Weights of the decoder layers' projections; lm_head is counted apart."""
        return self.layers * (self.attn_params_per_layer + self.mlp_params_per_layer)

    @property
    def lm_head_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def embedding_params(self) -> int:
        """Input embedding + lm_head (one matrix when tied)."""
        return self.lm_head_params * (1 if self.tied_embeddings else 2)

    @property
    def bias_params(self) -> int:
        per_layer = (self.q_dim + 2 * self.kv_dim) if self.qkv_bias else 0
        per_layer += (2 * self.intermediate + self.hidden) if self.mlp_bias else 0
        return self.layers * per_layer

    @property
    def norm_params(self) -> int:
        return (2 * self.layers + 1) * self.hidden  # two RMSNorms per layer + the final one

    @property
    def total_params(self) -> int:
        return self.matmul_params + self.embedding_params + self.bias_params + self.norm_params

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        return self.layers * self.kv_heads * self.head_dim * 2 * dtype_bytes  # 2: K and V


def arch_from_config(cfg: dict[str, Any], source: str = "config.json") -> Arch:
    """Read the fields the arithmetic needs; a missing or bad one is a UserError naming it."""
    if not isinstance(cfg, dict):
        raise UserError(f"{source}: expected a JSON object, got {type(cfg).__name__}")
    model_type = cfg.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise UserError(f"{source}: field 'model_type' is {model_type!r}; "
                        f"supported dense decoders: {', '.join(SUPPORTED_MODEL_TYPES)}")
    for moe_key in ("num_local_experts", "num_experts"):
        if cfg.get(moe_key):
            raise UserError(f"{source}: field '{moe_key}': mixture-of-experts models are not supported")

    def pos_int(key: str, default: Any = None) -> int:
        v = cfg.get(key, default)
        if v is None:
            raise UserError(f"{source}: field '{key}' is missing")
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise UserError(f"{source}: field '{key}' must be a positive integer, got {v!r}")
        return v

    hidden = pos_int("hidden_size")
    heads = pos_int("num_attention_heads")
    kv_heads = pos_int("num_key_value_heads", heads)  # absent: plain multi-head attention
    if heads % kv_heads:
        raise UserError(f"{source}: field 'num_key_value_heads' ({kv_heads}) must divide "
                        f"num_attention_heads ({heads})")
    if cfg.get("head_dim") is not None:
        head_dim = pos_int("head_dim")
    elif hidden % heads:
        raise UserError(f"{source}: field 'head_dim' is missing and hidden_size {hidden} "
                        f"is not a multiple of num_attention_heads {heads}")
    else:
        head_dim = hidden // heads
    return Arch(
        name=str(cfg.get("_name_or_path") or (cfg.get("architectures") or [model_type])[0]),
        model_type=model_type,
        hidden=hidden,
        intermediate=pos_int("intermediate_size"),
        layers=pos_int("num_hidden_layers"),
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        vocab=pos_int("vocab_size"),
        tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        qkv_bias=bool(cfg.get("attention_bias", model_type == "qwen2")),
        mlp_bias=bool(cfg.get("mlp_bias", False)),
    )


def load_config_json(path: str | Path) -> dict[str, Any]:
    """A config.json file, or a folder holding one."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    text = read_text(path, "config.json", "a config.json file")
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise UserError(f"{path}: line {e.lineno}: invalid JSON: {e.msg}") from None


def load_arch(path: str | Path) -> Arch:
    path = Path(path)
    source = str(path / "config.json" if path.is_dir() else path)
    return arch_from_config(load_config_json(path), source)


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

    def allreduce_ms(self, nbytes: float) -> float:
        """One ring all-reduce: 2 (TP-1)/TP * bytes over the per-direction link, plus latency."""
        if self.tp == 1:
            return 0.0
        ring_s = 2 * (self.tp - 1) / self.tp * nbytes / (self.gpu.link_gb_s * 1e9)
        return ring_s * 1e3 + self.eff.allreduce_latency_us / 1e3

    def time(self, w: StepWork) -> StepTime:
        peak_flops = self.gpu.bf16_tflops * 1e12
        return StepTime(
            compute_ms=self.flops_per_gpu(w) / (peak_flops * self.eff.mfu) * 1e3,
            memory_ms=self.bytes_per_gpu(w) / (self.gpu.hbm_gb_s * 1e9 * self.eff.bw_eff) * 1e3,
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
    bytes_per_call = dep.arch.hidden * dep.dtype_bytes * tokens
    ring_ms = 0.0 if dep.tp == 1 else (2 * (dep.tp - 1) / dep.tp * bytes_per_call
                                       / (dep.gpu.link_gb_s * 1e9) * 1e3)
    return RateCeiling(
        prefill_compute_ms=r.prefill.compute_ms,
        decode_compute_ms=max(output_len - 1, 0) * r.decode_step.compute_ms,
        comm_bandwidth_ms=2 * dep.arch.layers * ring_ms,
    )


# --------------------------------------------------------------------------- calibration

@dataclass
class Fit:
    """Efficiencies fitted to a study, with how they were found."""

    eff: Efficiency
    mfu_fitted: bool
    overhead_fitted: bool
    decode_points: int  # distinct batch sizes used
    decode_steps: int  # iteration records used
    prefill_point: str
    notes: list[str] = field(default_factory=list)


def deployment_from_study(config: dict[str, Any], device_name: str, gpus: dict[str, GPU] | None = None,
                          eff: Efficiency = PEAK) -> Deployment | None:
    """The deployment a study ran on, or None when its device is not in the GPU table."""
    from prefixstudy.config import parse_config

    gpu = find_gpu(device_name or "", gpus if gpus is not None else load_gpus())
    if gpu is None:
        return None
    cfg = parse_config(config, "config.yaml")
    cfg_json = load_config_json(Path(cfg.model))
    arch = arch_from_config(cfg_json, str(Path(cfg.model) / "config.json"))
    dtype = cfg.engine.dtype if cfg.engine.dtype != "auto" else str(cfg_json.get("torch_dtype", "bfloat16"))
    if dtype not in DTYPE_BYTES:
        raise UserError(f"config.yaml: field 'engine.dtype': unknown dtype {dtype!r}")
    return Deployment(arch, gpu, cfg.engine.tensor_parallel_size, DTYPE_BYTES[dtype], eff)


def _ok_requests(requests: "pd.DataFrame") -> "pd.DataFrame":
    return requests[(~requests["warmup"].astype(bool)) & (requests["error"].fillna("") == "")]


def _unsaturated(summary: "pd.DataFrame") -> list[tuple[str, float]]:
    sat = summary["saturated"].astype(str).str.lower().isin(["true", "1"])
    rows = summary[~sat]
    return sorted({(str(m), float(r)) for m, r in zip(rows["mode"], rows["rate"])})


def _decode_steps(iterations: "pd.DataFrame", points: list[tuple[str, float]]) -> "pd.DataFrame":
    """Pure decode iterations (no prompt tokens) of the given points, batch = generation_tokens."""
    import pandas as pd

    cols = ["mode", "rate", "prompt_tokens", "generation_tokens", "step_ms"]
    it = iterations
    if it.empty or any(c not in it for c in cols):
        return pd.DataFrame(columns=cols)
    keep = [(m, r) in set(points) for m, r in zip(it["mode"].astype(str), it["rate"].astype(float))]
    it = it[keep]
    it = it[(it["prompt_tokens"] == 0) & (it["generation_tokens"] > 0)]
    return it[it["step_ms"].notna() & (it["step_ms"] > 0)]


def calibrate(summary: "pd.DataFrame", requests: "pd.DataFrame", iterations: "pd.DataFrame",
              dep: Deployment, min_spread: float = 0.02) -> Fit:
    """Fit bw_eff and the per-step overhead to decode steps, then mfu to the OFF prefill.

    Decode: for each batch size B among the pure-decode iterations of unsaturated points,
    the median step time y_B is modelled as ``overhead + x_B / bw_eff + comm_B``, with
    x_B the memory time at 100 % HBM bandwidth (only memory-bound B, below the roofline
    ridge).  A weighted least-squares line gives both; when the x_B span less than
    ``min_spread`` (relative) the two cannot be told apart and the overhead keeps
    ``dep.eff.overhead_ms``.  Prefill: the mean engine-side prefill_ms of OFF at the
    lowest unsaturated rate, minus comm and overhead, is compute at ``mfu``.
    """
    import numpy as np

    notes: list[str] = []
    peak = dep.with_eff(Efficiency(allreduce_latency_us=dep.eff.allreduce_latency_us))
    points = _unsaturated(summary)
    if not points:
        raise UserError("summary.csv: no unsaturated point (column 'saturated' is True everywhere)")
    ok = _ok_requests(requests)
    if ok.empty:
        raise UserError("requests.parquet: no measured request without an error")
    ctx = float(ok["prompt_tokens"].mean() + ok["output_tokens"].mean() / 2)

    # Decode: bandwidth efficiency and overhead.
    steps = _decode_steps(iterations, points)
    xs, ys, ws = [], [], []
    for b, grp in steps.groupby("generation_tokens"):
        t = peak.time(decode_work(dep.arch, float(b), ctx, dep.dtype_bytes))
        if t.compute_ms >= t.memory_ms:
            continue  # compute-bound at this batch: says nothing about bandwidth
        xs.append(t.memory_ms)
        ys.append(float(grp["step_ms"].median()) - t.comm_ms)
        ws.append(len(grp))
    overhead, overhead_fitted = dep.eff.overhead_ms, False
    if not xs:
        # No iteration records: per-request decode steps at the lowest rate, as batch 1.
        low = min(r for _, r in points)
        dec = ok[(ok["output_tokens"] > 1) & (ok["rate"].astype(float) == low)
                 & ok["mode"].isin([md for md, r in points if r == low])]
        if dec.empty:
            raise UserError("requests.parquet: no request with more than one output token to fit decode")
        t = peak.time(decode_work(dep.arch, 1.0, ctx, dep.dtype_bytes))
        step = float((dec["decode_ms"] / (dec["output_tokens"] - 1)).mean())
        xs, ys, ws = [t.memory_ms], [step - t.comm_ms], [len(dec)]
        notes.append(f"no pure-decode iteration records: decode fitted to per-request steps at "
                     f"{low:g} req/s, taken as batch 1")
    if len(xs) >= 2 and (max(xs) - min(xs)) / float(np.mean(xs)) >= min_spread:
        slope, overhead = np.polyfit(xs, ys, 1, w=np.sqrt(ws))
        bw_eff, overhead_fitted = 1.0 / float(slope), True
        overhead = float(overhead)
        if overhead < 0:
            notes.append(f"fitted overhead is negative ({overhead:.3f} ms): noise or a model gap")
    else:
        x = float(np.average(xs, weights=ws))
        y = float(np.average(ys, weights=ws))
        bw_eff = x / (y - overhead)
        notes.append(f"decode batch sizes span too little memory traffic to separate overhead "
                     f"from bandwidth: overhead held at {overhead:g} ms")

    # Prefill: MFU from OFF (or the only mode) at the lowest unsaturated rate.
    mode = "off" if any(m == "off" for m, _ in points) else points[0][0]
    rate = min(r for m, r in points if m == mode)
    pre = ok[(ok["mode"] == mode) & (ok["rate"].astype(float) == rate)]
    mfu, mfu_fitted = 1.0, False
    if pre.empty:
        notes.append(f"no measured request at {mode} {rate:g} req/s: mfu held at 1")
    else:
        cached = float(pre["num_cached_tokens"].mean())
        new = float(pre["prompt_tokens"].mean()) - cached
        t = peak.time(prefill_work(dep.arch, new, cached, dep.dtype_bytes))
        compute_ms = float(pre["prefill_ms"].mean()) - t.comm_ms - overhead
        if compute_ms > t.memory_ms / bw_eff:
            mfu, mfu_fitted = t.compute_ms / compute_ms, True
        else:
            notes.append(f"prefill at {mode} {rate:g} req/s is memory-bound or faster than "
                         f"the model: mfu not identifiable, held at 1")
    eff = Efficiency(mfu, bw_eff, overhead, dep.eff.allreduce_latency_us)
    return Fit(eff, mfu_fitted, overhead_fitted, len(xs), int(sum(ws)), f"{mode} {rate:g} req/s", notes)


def model_vs_measurement(summary_df: "pd.DataFrame", requests_df: "pd.DataFrame",
                         iterations_df: "pd.DataFrame", config_dict: dict[str, Any], device_name: str,
                         eff: Efficiency | None = None,
                         gpus: dict[str, GPU] | None = None) -> "pd.DataFrame | None":
    """Measured vs predicted prefill, decode step and E2E per unsaturated point.

    None when ``device_name`` is not in the GPU table (e.g. "cpu").  Efficiencies are
    fitted to the same data (``calibrate``) unless ``eff`` is given; the fit is in
    ``df.attrs["fit"]``.  Long format: mode, rate, quantity, batch, measured_ms,
    predicted_ms, error_pct (predicted vs measured).  The model's config.json is read
    from the study config's ``model`` folder (relative to the working directory).
    """
    import pandas as pd

    dep = deployment_from_study(config_dict, device_name, gpus)
    if dep is None:
        return None
    if eff is None:
        fit = calibrate(summary_df, requests_df, iterations_df, dep)
        eff = fit.eff
        fit_attrs = {**asdict(fit), "eff": asdict(fit.eff)}
    else:
        fit_attrs = {"eff": asdict(eff), "notes": ["efficiencies given, not fitted"]}
    dep = dep.with_eff(eff)
    points = _unsaturated(summary_df)
    ok = _ok_requests(requests_df)
    steps = _decode_steps(iterations_df, points)
    rows = []
    for mode, rate in points:
        req = ok[(ok["mode"] == mode) & (ok["rate"].astype(float) == rate)]
        if req.empty:
            continue
        its = steps[(steps["mode"] == mode) & (steps["rate"].astype(float) == rate)]
        batch = float(its["generation_tokens"].mean()) if len(its) else 1.0
        prompt, out = float(req["prompt_tokens"].mean()), float(req["output_tokens"].mean())
        p = predict_request(dep, prompt, float(req["num_cached_tokens"].mean()), out, batch)
        dec = req[req["output_tokens"] > 1]
        measured = {
            "prefill_ms": float(req["prefill_ms"].mean()),
            "decode_step_ms": float((dec["decode_ms"] / (dec["output_tokens"] - 1)).mean())
            if len(dec) else math.nan,
            "e2e_ms": float(req["e2e_ms"].mean()),
        }
        predicted = {"prefill_ms": p.prefill.total_ms, "decode_step_ms": p.decode_step.total_ms,
                     "e2e_ms": p.e2e_ms}
        for q in measured:
            rows.append(dict(mode=mode, rate=rate, quantity=q, batch=batch, measured_ms=measured[q],
                             predicted_ms=predicted[q],
                             error_pct=(predicted[q] - measured[q]) / measured[q] * 100))
    df = pd.DataFrame(rows, columns=["mode", "rate", "quantity", "batch", "measured_ms",
                                     "predicted_ms", "error_pct"])
    df.attrs["fit"] = fit_attrs
    df.attrs["deployment"] = f"{dep.arch.name} on {dep.tp} x {dep.gpu.name}"
    return df


def plot_calibration(df: "pd.DataFrame") -> "Figure":
    """One panel per quantity: measured (markers) and predicted (lines) vs rate, ON and OFF."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    quantities = ["prefill_ms", "decode_step_ms", "e2e_ms"]
    fig = Figure(figsize=(12, 3.6), layout="constrained")
    axes = fig.subplots(1, len(quantities))
    colors = {"on": "tab:blue", "off": "tab:orange"}
    for ax, q in zip(axes, quantities):
        for mode, grp in df[df["quantity"] == q].groupby("mode"):
            grp = grp.sort_values("rate")
            c = colors.get(str(mode), "tab:gray")
            ax.plot(grp["rate"], grp["measured_ms"], "o", color=c, label=f"{mode} measured")
            ax.plot(grp["rate"], grp["predicted_ms"], "-", color=c, label=f"{mode} model")
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(ScalarFormatter())
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("offered rate (req/s)")
        ax.set_ylabel(q.replace("_ms", " (ms)"))
        ax.set_title(q.replace("_ms", ""))
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"model vs measurement: {df.attrs.get('deployment', '')}")
    return fig
