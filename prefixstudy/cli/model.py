"""``prefixstudy model``: the first-principles estimate, explained, or calibrated to a study.

Parses flags, calls ``prefixstudy.model`` and renders text; the arithmetic lives there.
Registered by the main CLI with ``main.add_command(model)``.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import click

from prefixstudy.model import roofline as m
from prefixstudy.errors import UserError
from prefixstudy.model.gpus import GPU, get_gpu, load_gpus

RC = m.REPORTED_CASE
_REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Case:
    config_path: str
    dep: m.Deployment
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
    p = Path(RC["config_json"])
    return str(p if p.exists() else _REPO / p)


def build_case(config_json: str | None, model_dir: str | None, gpu_name: str, tp: int,
               prompt_len: int, prefix_len: int, output_len: int, eff: m.Efficiency,
               gpus: dict[str, GPU], all_logits: bool = False,
               observed_off_ms: float | None = None, observed_on_ms: float | None = None) -> Case:
    if config_json and model_dir:
        raise UserError("give --config-json or --model-dir, not both")
    path = config_json or (str(Path(model_dir) / "config.json") if model_dir else _default_config_json())
    arch = m.load_arch(path)
    gpu = get_gpu(gpu_name, gpus)
    if prefix_len > prompt_len:
        raise UserError(f"--prefix-len {prefix_len} is longer than --prompt-len {prompt_len}")
    dep = m.Deployment(arch, gpu, tp, 2, eff, all_logits)
    note = "given on the command line"
    if observed_off_ms is None and observed_on_ms is None:
        reported = m.load_arch(_default_config_json())
        if (arch == reported and gpu.name == RC["gpu"] and tp == RC["tp"]
                and (prompt_len, prefix_len, output_len) == (RC["prompt_len"], RC["prefix_len"], RC["output_len"])):
            observed_off_ms, observed_on_ms = RC["observed_off_ms"], RC["observed_on_ms"]
            note = "the reported case of issue 4: mean E2E at 1 req/s"
    return Case(path, dep, prompt_len, prefix_len, output_len,
                observed_off_ms, observed_on_ms, note)


# --------------------------------------------------------------------------- rendering

def _t(flops: float) -> str:
    return f"{flops / 1e12:.3f} TFLOP" if flops >= 1e11 else f"{flops / 1e9:.3f} GFLOP"


def _row(label: str, t: m.StepTime, peak: m.StepTime) -> str:
    return (f"  {label:<22} {peak.compute_ms:9.3f} {peak.memory_ms:9.3f} {t.compute_ms:9.3f} "
            f"{t.memory_ms:9.3f} {t.comm_ms:8.3f} {t.overhead_ms:8.3f} {peak.total_ms:9.3f} "
            f"{t.total_ms:9.3f}  {t.bound}")


def render_explain(c: Case) -> str:
    dep, a, g, e = c.dep, c.dep.arch, c.dep.gpu, c.dep.eff
    peak = dep.with_eff(m.Efficiency(allreduce_latency_us=e.allreduce_latency_us))
    tp, db = dep.tp, dep.dtype_bytes
    sv = m.prefix_saving(dep, c.prefix_len, c.suffix_len, c.output_len)
    sv_peak = m.prefix_saving(peak, c.prefix_len, c.suffix_len, c.output_len)
    off, on = sv.off, sv.on
    L: list[str] = []
    add = L.append

    add("prefixstudy model: first-principles estimate (pure arithmetic; no vLLM, no GPU)")
    add("")
    add("0. Case and parameters")
    add(f"  model config     {c.config_path}  ({a.model_type}, {a.name})")
    add(f"  GPUs             {tp} x {g.name}, tensor parallel {tp}")
    add(f"  prompt           {c.prompt_len} tokens = {c.prefix_len} shared prefix + {c.suffix_len} unique")
    add(f"  output           {c.output_len} tokens")
    add(f"  dtype            bf16 weights and KV ({db} bytes)")
    add(f"  efficiencies     --mfu {e.mfu:g}  --bw-eff {e.bw_eff:g}  --overhead-ms {e.overhead_ms:g} per step")
    add(f"  all-reduce       --allreduce-latency-us {e.allreduce_latency_us:g} per call; 2 calls per layer")
    add(f"  logits           {'every token (--all-logits)' if dep.all_logits else 'last prompt token only (as vLLM)'}")
    add("")
    add("1. Architecture (from config.json)")
    add(f"  hidden {a.hidden}, layers {a.layers}, heads {a.heads} (kv heads {a.kv_heads}, GQA "
        f"{a.heads // a.kv_heads}:1), head_dim {a.head_dim}, MLP {a.intermediate} (SwiGLU), "
        f"vocab {a.vocab}, embeddings {'tied' if a.tied_embeddings else 'untied'}")
    add(f"  attention / layer  q {a.hidden}x{a.q_dim} + k {a.hidden}x{a.kv_dim} + v {a.hidden}x{a.kv_dim}"
        f" + o {a.q_dim}x{a.hidden} = {a.attn_params_per_layer:,}")
    add(f"  MLP / layer        3 x {a.hidden} x {a.intermediate} = {a.mlp_params_per_layer:,}")
    add(f"  matmul params      {a.layers} x {a.attn_params_per_layer + a.mlp_params_per_layer:,}"
        f" = {a.matmul_params:,}")
    add(f"  embeddings         embed + lm_head = {a.embedding_params:,}"
        f"{' (tied: one matrix)' if a.tied_embeddings else f' (2 x {a.lm_head_params:,})'}")
    add(f"  other              norms {a.norm_params:,}, biases {a.bias_params:,}")
    add(f"  total              {a.total_params:,} ({a.total_params / 1e9:.2f} B)")
    kvt = a.kv_bytes_per_token(db)
    add(f"  KV cache / token   {a.layers} layers x {a.kv_heads} kv heads x {a.head_dim} x 2 (K,V)"
        f" x {db} B = {kvt:,} B ({kvt / 1024:g} KiB)")
    add("")
    add(f"2. GPU: {g.name}  [{g.source}]")
    add(f"  {g.bf16_tflops:g} TFLOPS bf16 dense, HBM {g.hbm_gb_s:g} GB/s, link {g.link_gb_s:g} GB/s per "
        f"direction per GPU (datasheets quote NVLink as total bidirectional, i.e. 2x), {g.memory_gb:g} GB")
    add(f"  x {tp} GPUs: {tp * g.bf16_tflops:g} TFLOPS, {tp * g.hbm_gb_s:g} GB/s")
    add("")
    for label, r in (("cache OFF", off), ("cache ON", on)):
        w = r.prefill_work
        add(f"3{'a' if r is off else 'b'}. Prefill FLOPs, {label}: T = {r.new_tokens:g} new tokens on "
            f"C = {r.cached_tokens:g} cached (2 FLOPs per multiply-add)")
        add(f"  projections+MLP  2 x {a.matmul_params:,} x {w.tokens:g}".ljust(62) + f"= {_t(w.matmul_flops)}")
        add(f"  lm_head          2 x {a.lm_head_params:,} x {w.logits_tokens:g}".ljust(62)
            + f"= {_t(w.lm_head_flops)}")
        add(f"  attention        2 x 2 (QK,AV) x {a.layers} x {a.q_dim} x {w.attention_keys:,.0f} keys".ljust(62)
            + f"= {_t(w.attention_flops)}")
        add(f"                   (keys = T*C + T(T+1)/2, causal)")
        add(f"  total".ljust(62) + f"= {_t(w.flops)}")
        add(f"  ideal time at peak: {_t(w.flops)} / ({tp} x {g.bf16_tflops:g} TFLOPS) = "
            f"{dep.ideal_ms(w.flops):.3f} ms")
        add("")
    fo = off.prefill_work.flops
    rule = 2 * a.total_params * c.prompt_len
    add("4. FLOP conventions for the OFF prefill")
    add(f"  2 FLOPs per multiply-add (how TFLOPS peaks are quoted)  {_t(fo)}  -> {dep.ideal_ms(fo):.2f} ms")
    add(f"  1 FLOP per multiply-add                                 {_t(fo / 2)}  -> "
        f"{dep.ideal_ms(fo / 2):.2f} ms  (wrong against a 2-FLOP peak: 2x too fast)")
    add(f"  rule of thumb 2 x params x T = 2 x {a.total_params:,} x {c.prompt_len}  {_t(rule)}  -> "
        f"{dep.ideal_ms(rule):.2f} ms")
    add(f"  ('{tp} x A100 = 2.5 PFLOPS, 8.5 TFLOP, 3.5 ms' counts 1 FLOP per multiply-add against a "
        f"2-FLOP peak)")
    add("")
    add("5. Tensor-parallel all-reduces (ring: 2(TP-1)/TP x bytes / link + latency per call)")
    if tp == 1:
        add("  TP = 1: none")
    for label, w in (("OFF prefill", off.prefill_work), ("ON prefill", on.prefill_work),
                     ("decode, batch 1", off.decode_work)):
        if tp == 1:
            break
        one = dep.allreduce_ms(w.allreduce_bytes)
        add(f"  {label:<16} {w.tokens:g} tok x {a.hidden} x {db} B = {w.allreduce_bytes / 1e6:.3f} MB; "
            f"{2 * (tp - 1) / tp:.3f} x that / {g.link_gb_s:g} GB/s + {e.allreduce_latency_us:g} us = "
            f"{one * 1e3:.1f} us; x {w.allreduces} calls = {w.allreduces * one:.3f} ms")
    add("")
    add("6. Step times, ms (roofline: max(compute, memory) + comm + overhead)")
    add(f"  per GPU: FLOPs / TP; bytes = weights / TP ({off.prefill_work.weight_bytes / tp / 1e9:.3f} GB)"
        f" + K,V of every key attended")
    add(f"  {'step':<22} {'comp@pk':>9} {'mem@pk':>9} {'comp@eff':>9} {'mem@eff':>9} {'comm':>8} "
        f"{'ovh':>8} {'tot@pk':>9} {'tot@eff':>9}  bound@eff")
    add(_row("OFF prefill", off.prefill, sv_peak.off.prefill))
    add(_row("ON prefill", on.prefill, sv_peak.on.prefill))
    ctx = c.prompt_len + c.output_len / 2
    add(_row(f"decode B=1 ctx {ctx:g}", off.decode_step, sv_peak.off.decode_step))
    add("")
    add(f"7. One request at batch 1: E2E = prefill + (O - 1) x decode step "
        f"(the prefill step makes token 1; O = {c.output_len})")
    for label, r, rp in (("OFF", off, sv_peak.off), ("ON", on, sv_peak.on)):
        add(f"  {label:<3} at peak: {rp.prefill.total_ms:.3f} + {c.output_len - 1} x {rp.decode_step.total_ms:.3f}"
            f" = {rp.e2e_ms:.2f} ms;  at eff: {r.prefill.total_ms:.3f} + {c.output_len - 1} x "
            f"{r.decode_step.total_ms:.3f} = {r.e2e_ms:.2f} ms")
    add(f"  saving from caching {c.prefix_len} tokens: {_t(sv.flops)} fewer FLOPs")
    add(f"    compute only at peak          {dep.ideal_ms(sv.flops):.3f} ms   (the 'ideal' saving)")
    add(f"    roofline + comm at peak       {sv_peak.prefill_ms:.3f} ms")
    add(f"    roofline + comm at eff        {sv.prefill_ms:.3f} ms")
    add("")
    add(f"8. Decode step vs batch size (context {ctx:g} each, at eff)")
    add(f"  {'B':>5} {'compute':>9} {'memory':>9} {'comm':>8} {'total':>9} {'tok/s':>9}  bound")
    for b in (1, 2, 4, 8, 16, 32, 64, 128, 256):
        t = dep.time(m.decode_work(a, b, ctx, db))
        add(f"  {b:>5} {t.compute_ms:9.3f} {t.memory_ms:9.3f} {t.comm_ms:8.3f} {t.total_ms:9.3f} "
            f"{b / t.total_ms * 1e3:9.0f}  {t.bound}")
    add("")
    add(f"9. Rate ceilings at eff (engine time per request needed > 1/rate => saturation; "
        f"perfect batching)")
    for label, cached in (("OFF", 0), ("ON", c.prefix_len)):
        rc = m.rate_ceiling(dep, c.prompt_len, cached, c.output_len)
        add(f"  {label:<3} prefill compute {rc.prefill_compute_ms:.3f} ms -> {rc.prefill_rps:,.1f} req/s "
            f"({rc.prefill_rps * c.prompt_len:,.0f} prompt tok/s served); + decode compute "
            f"{rc.decode_compute_ms:.3f} ms + all-reduce bandwidth {rc.comm_bandwidth_ms:.3f} ms "
            f"= {rc.engine_ms:.3f} ms -> {rc.engine_rps:,.1f} req/s")
    r_off = m.rate_ceiling(dep, c.prompt_len, 0, c.output_len).engine_rps
    r_on = m.rate_ceiling(dep, c.prompt_len, c.prefix_len, c.output_len).engine_rps
    add(f"  between {r_off:,.1f} and {r_on:,.1f} req/s OFF must saturate while ON need not")
    add("")
    add("10. Where the observation sits")
    if c.observed_off_ms is None or c.observed_on_ms is None:
        add("  no observation given (--observed-off-ms, --observed-on-ms)")
    else:
        obs_sv = c.observed_off_ms - c.observed_on_ms
        ideal = dep.ideal_ms(sv.flops)
        add(f"  observed ({c.observed_note}): OFF {c.observed_off_ms:g} ms, ON {c.observed_on_ms:g} ms"
            f" -> saving {obs_sv:.2f} ms")
        add(f"  predicted saving: {ideal:.2f} ms compute-only at peak, {sv_peak.prefill_ms:.2f} ms with "
            f"roofline + comm at peak" + (f"; observed / ideal = {obs_sv / ideal:.2f}x" if ideal > 0 else ""))
        if obs_sv > 0 and ideal > 0:
            add(f"  implied MFU if the whole saving is prefill compute: {ideal:.2f} / {obs_sv:.2f} = "
                f"{ideal / obs_sv:.1%}")
        dec_floor = (c.output_len - 1) * sv_peak.off.decode_step.memory_ms
        for label, obs, rp in (("OFF", c.observed_off_ms, sv_peak.off), ("ON", c.observed_on_ms, sv_peak.on)):
            floor = rp.prefill.compute_ms + dec_floor
            left = obs - rp.prefill.compute_ms
            add(f"  {label:<3} floor: prefill compute at peak {rp.prefill.compute_ms:.2f} ms + "
                f"{c.output_len - 1} x {sv_peak.off.decode_step.memory_ms:.3f} ms (weights + KV at 100% HBM) = "
                f"{floor:.1f} ms vs observed {obs:g} ms"
                + (f" -> implied bandwidth efficiency {dec_floor / left:.0%}" if left > 0 < dec_floor else ""))
        if min(c.observed_off_ms, c.observed_on_ms) < dec_floor:
            steps = (c.observed_on_ms - sv_peak.on.prefill.compute_ms) / sv_peak.off.decode_step.memory_ms
            add(f"  !! the observed latency is below the bandwidth floor of {c.output_len} output tokens:")
            add(f"     at 100% HBM bandwidth it leaves room for at most {max(steps, 0):.0f} decode steps. Check")
            add("     the tokens actually generated (early EOS / ignore_eos), that the latency is E2E and not")
            add("     TTFT, the dtype / quantization, and the GPU."
                + (f" The prefill saving alone fits the model only at {ideal / obs_sv:.0%} MFU."
                   if obs_sv > 0 and ideal > 0 else ""))
    return "\n".join(L)


def render_summary(c: Case) -> str:
    dep = c.dep
    sv = m.prefix_saving(dep, c.prefix_len, c.suffix_len, c.output_len)
    rc_off = m.rate_ceiling(dep, c.prompt_len, 0, c.output_len)
    rc_on = m.rate_ceiling(dep, c.prompt_len, c.prefix_len, c.output_len)
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


def render_calibration(fit: m.Fit, df) -> str:
    e = fit.eff
    L = [f"model vs measurement: {df.attrs.get('deployment', '')}",
         f"fitted: mfu {e.mfu:.4f}{'' if fit.mfu_fitted else ' (not fitted)'} from prefill at "
         f"{fit.prefill_point}; bw_eff {e.bw_eff:.4f}, overhead {e.overhead_ms:.4f} ms/step"
         f"{'' if fit.overhead_fitted else ' (held)'} from {fit.decode_steps} decode steps at "
         f"{fit.decode_points} batch size(s); all-reduce latency {e.allreduce_latency_us:g} us (given)"]
    L += [f"note: {n}" for n in fit.notes]
    L.append(f"{'mode':<5} {'rate':>7} {'quantity':<15} {'batch':>6} {'measured':>10} {'model':>10} {'error':>8}")
    for r in df.itertuples():
        L.append(f"{r.mode:<5} {r.rate:>7g} {r.quantity:<15} {r.batch:>6.2f} {r.measured_ms:>10.3f} "
                 f"{r.predicted_ms:>10.3f} {r.error_pct:>7.1f}%")
    return "\n".join(L)


def run_calibrate(results_dir: Path, gpus: dict[str, GPU], eff: m.Efficiency) -> str:
    from prefixstudy.results import load

    res = load(results_dir)
    device = str(res.manifest.get("device", ""))
    dep = m.deployment_from_study(res.config, device, gpus, eff)
    if dep is None:
        raise UserError(f"{res.path / 'manifest.json'}: device {device!r} is not in the GPU table "
                        f"(add it with --gpus-file)")
    fit = m.calibrate(res.summary, res.requests, res.iterations, dep)
    df = m.model_vs_measurement(res.summary, res.requests, res.iterations, res.config, device,
                                eff=fit.eff, gpus=gpus)
    out = res.path / "plots" / "model_calibration.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    fig = m.plot_calibration(df)
    fig.savefig(out, dpi=120)
    return render_calibration(fit, df) + f"\nfigure: {out}"


# --------------------------------------------------------------------------- command

@click.command("model")
@click.option("--explain", is_flag=True, help="Print every step of the arithmetic.")
@click.option("--calibrate", "calibrate_dir", type=click.Path(path_type=Path), default=None,
              metavar="RESULTS_DIR", help="Fit mfu, bw_eff and overhead to a measured study.")
@click.option("--config-json", type=str, default=None, help="A Hugging Face config.json.")
@click.option("--model-dir", type=str, default=None, help="A folder holding config.json.")
@click.option("--gpu", "gpu_name", default=RC["gpu"], show_default=True,
              help="GPU table entry or torch device name.")
@click.option("--tp", type=click.IntRange(min=1), default=RC["tp"], show_default=True,
              help="Tensor-parallel size.")
@click.option("--prompt-len", type=click.IntRange(min=1), default=RC["prompt_len"], show_default=True)
@click.option("--prefix-len", type=click.IntRange(min=0), default=RC["prefix_len"], show_default=True,
              help="Shared prefix tokens the cache can serve.")
@click.option("--output-len", type=click.IntRange(min=1), default=RC["output_len"], show_default=True)
@click.option("--mfu", type=click.FloatRange(min=0, min_open=True, max=1), default=0.5, show_default=True)
@click.option("--bw-eff", type=click.FloatRange(min=0, min_open=True, max=1), default=0.8, show_default=True)
@click.option("--overhead-ms", type=click.FloatRange(min=0), default=0.0, show_default=True,
              help="Fixed time per engine step.")
@click.option("--allreduce-latency-us", type=click.FloatRange(min=0), default=10.0, show_default=True)
@click.option("--all-logits", is_flag=True, help="Run lm_head on every prompt token (vLLM: last only).")
@click.option("--observed-off-ms", type=float, default=None, help="Measured mean latency, cache OFF.")
@click.option("--observed-on-ms", type=float, default=None, help="Measured mean latency, cache ON.")
@click.option("--gpus-file", type=click.Path(path_type=Path), default=None,
              help="YAML adding or overriding GPU table entries.")
def model(explain, calibrate_dir, config_json, model_dir, gpu_name, tp, prompt_len, prefix_len,
          output_len, mfu, bw_eff, overhead_ms, allreduce_latency_us, all_logits, observed_off_ms,
          observed_on_ms, gpus_file):
    """First-principles prefill/decode model; defaults are the reported Mistral-7B case."""
    try:
        gpus = load_gpus(gpus_file)
        if calibrate_dir is not None:
            eff = m.Efficiency(overhead_ms=overhead_ms, allreduce_latency_us=allreduce_latency_us)
            click.echo(run_calibrate(calibrate_dir, gpus, eff))
            return
        eff = m.Efficiency(mfu, bw_eff, overhead_ms, allreduce_latency_us)
        case = build_case(config_json, model_dir, gpu_name, tp, prompt_len, prefix_len, output_len,
                          eff, gpus, all_logits, observed_off_ms, observed_on_ms)
        click.echo(render_explain(case) if explain else render_summary(case))
    except UserError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(2)
