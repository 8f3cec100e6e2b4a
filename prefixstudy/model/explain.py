"""Stage: model.  The text ``prefixstudy model`` prints: a case, its summary, every step of it.

``build_case`` turns the command's inputs into a ``Case`` (by default the reported case,
Mistral-7B on 8 x A100, TP 8, with its observation); ``render_summary`` and ``render_explain``
return the text.  Every number printed is computed here or in ``roofline``; the command only echoes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from prefixstudy.errors import UserError
from prefixstudy.costmodel.arch import load_arch
from prefixstudy.costmodel.gpus import GPU, get_gpu
from prefixstudy.costmodel.roofline import (Deployment, Efficiency, PrefixSaving, StepTime, decode_work,
                                        prefix_saving, rate_ceiling)

# The reported case: Mistral-7B-v0.3 on 8 x A100-SXM4-40GB, TP 8.
REPORTED_CASE = dict(
    config_json="experiments/models/mistral-7b-v0.3/config.json",
    gpu="A100-SXM4-40GB", tp=8, prompt_len=1214, prefix_len=1198, output_len=143,
    observed_off_ms=115.35, observed_on_ms=94.56,  # mean client E2E at 1 req/s
)
RC = REPORTED_CASE
_REPO = Path(__file__).resolve().parents[2]
DECODE_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)


@dataclass(frozen=True)
class Case:
    config_path: str
    dep: Deployment
    prompt_len: int
    prefix_len: int
    output_len: int
    observed_off_ms: float | None
    observed_on_ms: float | None
    observed_note: str

    @property
    def suffix_len(self) -> int:
        return self.prompt_len - self.prefix_len


def _default_config_json() -> str:
    # The shipped model folder (prefixstudy/configs/models/<name>/), found from any directory.
    from prefixstudy.configs import shipped_model_dir

    return str(shipped_model_dir(Path(RC["config_json"]).parent.name) / "config.json")


def build_case(config_json: str | None, model_dir: str | None, gpu_name: str, tp: int,
               prompt_len: int, prefix_len: int, output_len: int, eff: Efficiency,
               gpus: dict[str, GPU], all_logits: bool = False,
               observed_off_ms: float | None = None, observed_on_ms: float | None = None) -> Case:
    """The case to print; the reported case gets its observed latencies when none are given."""
    if config_json and model_dir:
        raise UserError("give --config-json or --model-dir, not both")
    path = config_json or (str(Path(model_dir) / "config.json") if model_dir else _default_config_json())
    arch = load_arch(path)
    gpu = get_gpu(gpu_name, gpus)
    if prefix_len > prompt_len:
        raise UserError(f"--prefix-len {prefix_len} is longer than --prompt-len {prompt_len}")
    dep = Deployment(arch, gpu, tp, 2, eff, all_logits)
    note = "given on the command line"
    if observed_off_ms is None and observed_on_ms is None:
        reported = load_arch(_default_config_json())
        if (arch == reported and gpu.name == RC["gpu"] and tp == RC["tp"]
                and (prompt_len, prefix_len, output_len) == (RC["prompt_len"], RC["prefix_len"], RC["output_len"])):
            observed_off_ms, observed_on_ms = RC["observed_off_ms"], RC["observed_on_ms"]
            note = "the reported case, Mistral-7B on 8 x A100 at TP 8: mean E2E at 1 req/s"
    return Case(path, dep, prompt_len, prefix_len, output_len,
                observed_off_ms, observed_on_ms, note)


# --------------------------------------------------------------------------- the numbers

@dataclass(frozen=True)
class Numbers:
    """The predictions --explain prints: at the given efficiencies and at peak."""

    peak: Deployment  # every efficiency 1, the all-reduce latency kept
    sv: PrefixSaving
    sv_peak: PrefixSaving


def numbers(c: Case) -> Numbers:
    dep = c.dep
    peak = dep.with_eff(Efficiency(allreduce_latency_us=dep.eff.allreduce_latency_us))
    return Numbers(peak, prefix_saving(dep, c.prefix_len, c.suffix_len, c.output_len),
                   prefix_saving(peak, c.prefix_len, c.suffix_len, c.output_len))


@dataclass(frozen=True)
class Observation:
    """Where an observed OFF / ON latency pair sits against the model (section 10)."""

    saving_ms: float  # observed OFF - ON
    ideal_ms: float  # the saving's FLOPs at peak, compute only
    step_floor_ms: float  # one decode step at batch 1: weights + KV at 100 % HBM bandwidth
    decode_floor_ms: float  # (O - 1) such steps
    steps_room: float  # decode steps the observed ON latency leaves room for at 100 % HBM


def observation(c: Case, n: Numbers) -> Observation:
    assert c.observed_off_ms is not None and c.observed_on_ms is not None
    step = n.sv_peak.off.decode_step.memory_ms
    return Observation(
        saving_ms=c.observed_off_ms - c.observed_on_ms,
        ideal_ms=c.dep.ideal_ms(n.sv.flops),
        step_floor_ms=step,
        decode_floor_ms=(c.output_len - 1) * step,
        steps_room=(c.observed_on_ms - n.sv_peak.on.prefill.compute_ms) / step,
    )


# --------------------------------------------------------------------------- text

def _t(flops: float) -> str:
    return f"{flops / 1e12:.3f} TFLOP" if flops >= 1e11 else f"{flops / 1e9:.3f} GFLOP"


def _row(label: str, t: StepTime, peak: StepTime) -> str:
    return (f"  {label:<22} {peak.compute_ms:9.3f} {peak.memory_ms:9.3f} {t.compute_ms:9.3f} "
            f"{t.memory_ms:9.3f} {t.comm_ms:8.3f} {t.overhead_ms:8.3f} {peak.total_ms:9.3f} "
            f"{t.total_ms:9.3f}  {t.bound}")


def _case(c: Case) -> list[str]:
    dep, a, g, e = c.dep, c.dep.arch, c.dep.gpu, c.dep.eff
    return [
        "0. Case and parameters",
        f"  model config     {c.config_path}  ({a.model_type}, {a.name})",
        f"  GPUs             {dep.tp} x {g.name}, tensor parallel {dep.tp}",
        f"  prompt           {c.prompt_len} tokens = {c.prefix_len} shared prefix + {c.suffix_len} unique",
        f"  output           {c.output_len} tokens",
        f"  dtype            bf16 weights and KV ({dep.dtype_bytes} bytes)",
        f"  efficiencies     --mfu {e.mfu:g}  --bw-eff {e.bw_eff:g}  --overhead-ms {e.overhead_ms:g} per step",
        f"  all-reduce       --allreduce-latency-us {e.allreduce_latency_us:g} per call; 2 calls per layer",
        f"  logits           {'every token (--all-logits)' if dep.all_logits else 'last prompt token only (as vLLM)'}",
        "",
    ]


def _architecture(c: Case) -> list[str]:
    a, db = c.dep.arch, c.dep.dtype_bytes
    kvt = a.kv_bytes_per_token(db)
    return [
        "1. Architecture (from config.json)",
        f"  hidden {a.hidden}, layers {a.layers}, heads {a.heads} (kv heads {a.kv_heads}, GQA "
        f"{a.heads // a.kv_heads}:1), head_dim {a.head_dim}, MLP {a.intermediate} (SwiGLU), "
        f"vocab {a.vocab}, embeddings {'tied' if a.tied_embeddings else 'untied'}",
        f"  attention / layer  q {a.hidden}x{a.q_dim} + k {a.hidden}x{a.kv_dim} + v {a.hidden}x{a.kv_dim}"
        f" + o {a.q_dim}x{a.hidden} = {a.attn_params_per_layer:,}",
        f"  MLP / layer        3 x {a.hidden} x {a.intermediate} = {a.mlp_params_per_layer:,}",
        f"  matmul params      {a.layers} x {a.attn_params_per_layer + a.mlp_params_per_layer:,}"
        f" = {a.matmul_params:,}",
        f"  embeddings         embed + lm_head = {a.embedding_params:,}"
        f"{' (tied: one matrix)' if a.tied_embeddings else f' (2 x {a.lm_head_params:,})'}",
        f"  other              norms {a.norm_params:,}, biases {a.bias_params:,}",
        f"  total              {a.total_params:,} ({a.total_params / 1e9:.2f} B)",
        f"  KV cache / token   {a.layers} layers x {a.kv_heads} kv heads x {a.head_dim} x 2 (K,V)"
        f" x {db} B = {kvt:,} B ({kvt / 1024:g} KiB)",
        "",
    ]


def _gpu(c: Case) -> list[str]:
    g, tp = c.dep.gpu, c.dep.tp
    return [
        f"2. GPU: {g.name}  [{g.source}]",
        f"  {g.bf16_tflops:g} TFLOPS bf16 dense, HBM {g.hbm_gb_s:g} GB/s, link {g.link_gb_s:g} GB/s per "
        f"direction per GPU (datasheets quote NVLink as total bidirectional, i.e. 2x), {g.memory_gb:g} GB",
        f"  x {tp} GPUs: {tp * g.bf16_tflops:g} TFLOPS, {tp * g.hbm_gb_s:g} GB/s",
        "",
    ]


def _prefill_flops(c: Case, n: Numbers) -> list[str]:
    dep, a, g = c.dep, c.dep.arch, c.dep.gpu
    L: list[str] = []
    for label, r in (("cache OFF", n.sv.off), ("cache ON", n.sv.on)):
        w = r.prefill_work
        L += [
            f"3{'a' if r is n.sv.off else 'b'}. Prefill FLOPs, {label}: T = {r.new_tokens:g} new tokens on "
            f"C = {r.cached_tokens:g} cached (2 FLOPs per multiply-add)",
            f"  projections+MLP  2 x {a.matmul_params:,} x {w.tokens:g}".ljust(62) + f"= {_t(w.matmul_flops)}",
            f"  lm_head          2 x {a.lm_head_params:,} x {w.logits_tokens:g}".ljust(62)
            + f"= {_t(w.lm_head_flops)}",
            f"  attention        2 x 2 (QK,AV) x {a.layers} x {a.q_dim} x {w.attention_keys:,.0f} keys".ljust(62)
            + f"= {_t(w.attention_flops)}",
            "                   (keys = T*C + T(T+1)/2, causal)",
            "  total".ljust(62) + f"= {_t(w.flops)}",
            f"  ideal time at peak: {_t(w.flops)} / ({dep.tp} x {g.bf16_tflops:g} TFLOPS) = "
            f"{dep.ideal_ms(w.flops):.3f} ms",
            "",
        ]
    return L


def _conventions(c: Case, n: Numbers) -> list[str]:
    dep, a, tp = c.dep, c.dep.arch, c.dep.tp
    fo = n.sv.off.prefill_work.flops
    rule = 2 * a.total_params * c.prompt_len
    return [
        "4. FLOP conventions for the OFF prefill",
        f"  2 FLOPs per multiply-add (how TFLOPS peaks are quoted)  {_t(fo)}  -> {dep.ideal_ms(fo):.2f} ms",
        f"  1 FLOP per multiply-add                                 {_t(fo / 2)}  -> "
        f"{dep.ideal_ms(fo / 2):.2f} ms  (wrong against a 2-FLOP peak: 2x too fast)",
        f"  rule of thumb 2 x params x T = 2 x {a.total_params:,} x {c.prompt_len}  {_t(rule)}  -> "
        f"{dep.ideal_ms(rule):.2f} ms",
        f"  ('{tp} x A100 = 2.5 PFLOPS, 8.5 TFLOP, 3.5 ms' counts 1 FLOP per multiply-add against a "
        f"2-FLOP peak)",
        "",
    ]


def _allreduces(c: Case, n: Numbers) -> list[str]:
    dep, tp, db = c.dep, c.dep.tp, c.dep.dtype_bytes
    L = ["5. Tensor-parallel all-reduces (ring: 2(TP-1)/TP x bytes / link + latency per call)"]
    if tp == 1:
        return L + ["  TP = 1: none", ""]
    for label, w in (("OFF prefill", n.sv.off.prefill_work), ("ON prefill", n.sv.on.prefill_work),
                     ("decode, batch 1", n.sv.off.decode_work)):
        one = dep.allreduce_ms(w.allreduce_bytes)
        L.append(f"  {label:<16} {w.tokens:g} tok x {dep.arch.hidden} x {db} B = {w.allreduce_bytes / 1e6:.3f} MB; "
                 f"{2 * (tp - 1) / tp:.3f} x that / {dep.gpu.link_gb_s:g} GB/s + "
                 f"{dep.eff.allreduce_latency_us:g} us = "
                 f"{one * 1e3:.1f} us; x {w.allreduces} calls = {w.allreduces * one:.3f} ms")
    return L + [""]


def _step_times(c: Case, n: Numbers) -> list[str]:
    off, pk = n.sv.off, n.sv_peak
    ctx = c.prompt_len + c.output_len / 2
    return [
        "6. Step times, ms (roofline: max(compute, memory) + comm + overhead)",
        f"  per GPU: FLOPs / TP; bytes = weights / TP ({off.prefill_work.weight_bytes / c.dep.tp / 1e9:.3f} GB)"
        f" + K,V of every key attended",
        f"  {'step':<22} {'comp@pk':>9} {'mem@pk':>9} {'comp@eff':>9} {'mem@eff':>9} {'comm':>8} "
        f"{'ovh':>8} {'tot@pk':>9} {'tot@eff':>9}  bound@eff",
        _row("OFF prefill", off.prefill, pk.off.prefill),
        _row("ON prefill", n.sv.on.prefill, pk.on.prefill),
        _row(f"decode B=1 ctx {ctx:g}", off.decode_step, pk.off.decode_step),
        "",
    ]


def _one_request(c: Case, n: Numbers) -> list[str]:
    dep, sv, o = c.dep, n.sv, c.output_len
    L = [f"7. One request at batch 1: E2E = prefill + (O - 1) x decode step "
         f"(the prefill step makes token 1; O = {o})"]
    for label, r, rp in (("OFF", sv.off, n.sv_peak.off), ("ON", sv.on, n.sv_peak.on)):
        L.append(f"  {label:<3} at peak: {rp.prefill.total_ms:.3f} + {o - 1} x {rp.decode_step.total_ms:.3f}"
                 f" = {rp.e2e_ms:.2f} ms;  at eff: {r.prefill.total_ms:.3f} + {o - 1} x "
                 f"{r.decode_step.total_ms:.3f} = {r.e2e_ms:.2f} ms")
    return L + [
        f"  saving from caching {c.prefix_len} tokens: {_t(sv.flops)} fewer FLOPs",
        f"    compute only at peak          {dep.ideal_ms(sv.flops):.3f} ms   (the 'ideal' saving)",
        f"    roofline + comm at peak       {n.sv_peak.prefill_ms:.3f} ms",
        f"    roofline + comm at eff        {sv.prefill_ms:.3f} ms",
        "",
    ]


def _decode_batches(c: Case) -> list[str]:
    dep = c.dep
    ctx = c.prompt_len + c.output_len / 2
    L = [f"8. Decode step vs batch size (context {ctx:g} each, at eff)",
         f"  {'B':>5} {'compute':>9} {'memory':>9} {'comm':>8} {'total':>9} {'tok/s':>9}  bound"]
    for b in DECODE_BATCHES:
        t = dep.time(decode_work(dep.arch, b, ctx, dep.dtype_bytes))
        L.append(f"  {b:>5} {t.compute_ms:9.3f} {t.memory_ms:9.3f} {t.comm_ms:8.3f} {t.total_ms:9.3f} "
                 f"{b / t.total_ms * 1e3:9.0f}  {t.bound}")
    return L + [""]


def _rate_ceilings(c: Case) -> list[str]:
    L = ["9. Rate ceilings at eff (engine time per request needed > 1/rate => saturation; "
         "perfect batching)"]
    rcs = {label: rate_ceiling(c.dep, c.prompt_len, cached, c.output_len)
           for label, cached in (("OFF", 0), ("ON", c.prefix_len))}
    for label, rc in rcs.items():
        L.append(f"  {label:<3} prefill compute {rc.prefill_compute_ms:.3f} ms -> {rc.prefill_rps:,.1f} req/s "
                 f"({rc.prefill_rps * c.prompt_len:,.0f} prompt tok/s served); + decode compute "
                 f"{rc.decode_compute_ms:.3f} ms + all-reduce bandwidth {rc.comm_bandwidth_ms:.3f} ms "
                 f"= {rc.engine_ms:.3f} ms -> {rc.engine_rps:,.1f} req/s")
    L.append(f"  between {rcs['OFF'].engine_rps:,.1f} and {rcs['ON'].engine_rps:,.1f} req/s "
             f"OFF must saturate while ON need not")
    return L + [""]


def _observed(c: Case, n: Numbers) -> list[str]:
    L = ["10. Where the observation sits"]
    if c.observed_off_ms is None or c.observed_on_ms is None:
        return L + ["  no observation given (--observed-off-ms, --observed-on-ms)"]
    ob, pk, o = observation(c, n), n.sv_peak, c.output_len
    obs_sv, ideal = ob.saving_ms, ob.ideal_ms
    L += [f"  observed ({c.observed_note}): OFF {c.observed_off_ms:g} ms, ON {c.observed_on_ms:g} ms"
          f" -> saving {obs_sv:.2f} ms",
          f"  predicted saving: {ideal:.2f} ms compute-only at peak, {pk.prefill_ms:.2f} ms with "
          f"roofline + comm at peak" + (f"; observed / ideal = {obs_sv / ideal:.2f}x" if ideal > 0 else "")]
    if obs_sv > 0 and ideal > 0:
        L.append(f"  implied MFU if the whole saving is prefill compute: {ideal:.2f} / {obs_sv:.2f} = "
                 f"{ideal / obs_sv:.1%}")
    for label, obs, rp in (("OFF", c.observed_off_ms, pk.off), ("ON", c.observed_on_ms, pk.on)):
        floor = rp.prefill.compute_ms + ob.decode_floor_ms
        left = obs - rp.prefill.compute_ms
        L.append(f"  {label:<3} floor: prefill compute at peak {rp.prefill.compute_ms:.2f} ms + "
                 f"{o - 1} x {ob.step_floor_ms:.3f} ms (weights + KV at 100% HBM) = "
                 f"{floor:.1f} ms vs observed {obs:g} ms"
                 + (f" -> implied bandwidth efficiency {ob.decode_floor_ms / left:.0%}"
                    if left > 0 < ob.decode_floor_ms else ""))
    if min(c.observed_off_ms, c.observed_on_ms) < ob.decode_floor_ms:
        L += [f"  !! the observed latency is below the bandwidth floor of {o} output tokens:",
              f"     at 100% HBM bandwidth it leaves room for at most {max(ob.steps_room, 0):.0f} decode steps. Check",
              "     the tokens actually generated (early EOS / ignore_eos), that the latency is E2E and not",
              "     TTFT, the dtype / quantization, and the GPU."
              + (f" The prefill saving alone fits the model only at {ideal / obs_sv:.0%} MFU."
                 if obs_sv > 0 and ideal > 0 else "")]
    return L


def render_explain(c: Case) -> str:
    """Every step of the arithmetic for one case, sections 0 to 10."""
    n = numbers(c)
    L = ["prefixstudy model: first-principles estimate (pure arithmetic; no vLLM, no GPU)", ""]
    L += _case(c) + _architecture(c) + _gpu(c) + _prefill_flops(c, n) + _conventions(c, n)
    L += _allreduces(c, n) + _step_times(c, n) + _one_request(c, n) + _decode_batches(c)
    L += _rate_ceilings(c) + _observed(c, n)
    return "\n".join(L)


def render_summary(c: Case) -> str:
    """The headline numbers of one case, one per line."""
    dep = c.dep
    sv = prefix_saving(dep, c.prefix_len, c.suffix_len, c.output_len)
    rc_off = rate_ceiling(dep, c.prompt_len, 0, c.output_len)
    rc_on = rate_ceiling(dep, c.prompt_len, c.prefix_len, c.output_len)
    e = dep.eff
    rows = [
        ("model", f"{dep.arch.name} ({dep.arch.total_params / 1e9:.2f} B params)"),
        ("hardware", f"{dep.tp} x {dep.gpu.name}, TP {dep.tp}"),
        ("request", f"prompt {c.prompt_len} = {c.prefix_len} prefix + {c.suffix_len}, output {c.output_len}"),
        ("parameters", f"mfu {e.mfu:g}, bw_eff {e.bw_eff:g}, overhead {e.overhead_ms:g} ms/step, "
                       f"all-reduce latency {e.allreduce_latency_us:g} us"),
        ("prefill FLOPs OFF / ON", f"{_t(sv.off.prefill_work.flops)} / {_t(sv.on.prefill_work.flops)}"),
        ("prefill ideal at peak", f"{dep.ideal_ms(sv.off.prefill_work.flops):.3f} / "
                                  f"{dep.ideal_ms(sv.on.prefill_work.flops):.3f} ms"),
        ("prefill step OFF / ON", f"{sv.off.prefill.total_ms:.3f} / {sv.on.prefill.total_ms:.3f} ms"),
        ("decode step, batch 1", f"{sv.off.decode_step.total_ms:.3f} ms ({sv.off.decode_step.bound}-bound)"),
        ("E2E batch 1 OFF / ON", f"{sv.off.e2e_ms:.2f} / {sv.on.e2e_ms:.2f} ms"),
        ("saving, ideal / at eff", f"{dep.ideal_ms(sv.flops):.3f} / {sv.prefill_ms:.3f} ms"),
        ("rate ceiling OFF / ON", f"{rc_off.engine_rps:,.1f} / {rc_on.engine_rps:,.1f} req/s"),
    ]
    return "\n".join(f"{k:<24} {v}" for k, v in rows) + "\n(--explain shows every step)"
