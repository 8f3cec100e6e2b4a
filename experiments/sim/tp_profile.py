"""What a TP-k shard profile on one H200 says about the TP 1 -> TP 2 transfer, against the fits.

    PYTHONPATH=. python experiments/sim/tp_profile.py [--check]

Reads the shard profile (experiments/results/h200-tp-shard-profile/, four runs of
experiments/gpu/tp_shard_profile.py on one H200: the median of the runs per shape) and the step-cost
fits of the committed h200-tp1 and h200-tp2 studies (``costmodel.step_cost.fit``), and writes ratios.md beside
the profile: per cost term, the TP 2 / TP 1 ratio as the fits measured it, as the roofline transfer
assumes it (``costmodel.transfer.roofline_terms``) and, for the prefill term, as the profile gives it
(the four GEMMs of every layer at a chunk of 2048 tokens, plus the ring all-reduce bytes over the
datasheet link).  ``--check`` fails if ratios.md is not what the committed files give.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROFILE = REPO / "experiments/results/h200-tp-shard-profile"
STUDIES = {1: REPO / "experiments/results/h200-tp1-sync", 2: REPO / "experiments/results/h200-tp2"}
# TP 1 through Ray's executor, as TP 2 ran: the ratio to it is the degree's alone.
RAY_TP1 = REPO / "experiments/results/h200-tp1-ray"
LAYER_GEMMS = ("qkv", "o", "gate_up", "down")
CHUNK = 2048  # tokens: a long prefill chunk, where the GEMMs' own time dominates their launch


def profile_ms(profile_dir: Path) -> dict[tuple, float]:
    """Median over the profile's runs, per (tp, op, tokens)."""
    runs = [json.loads(p.read_text())["rows"] for p in sorted(profile_dir.glob("tp_shard_profile*.json"))]
    out: dict[tuple, list[float]] = {}
    for rows in runs:
        for r in rows:
            if "tokens" in r:
                out.setdefault((r["tp"], r["op"], r["tokens"]), []).append(r["ms"])
    return {k: statistics.median(v) for k, v in out.items()}


def prefill_ms_per_token(ms: dict[tuple, float], tp: int, layers: int, hidden: int, link_gb_s: float) -> float:
    gemm = sum(ms[(tp, op, CHUNK)] for op in LAYER_GEMMS) * layers / CHUNK
    allreduce = 2 * layers * hidden * 2 * 2 * (tp - 1) / tp / (link_gb_s * 1e9) * 1e3
    return gemm + allreduce


def table() -> str:
    from prefixstudy.config import load_config
    from prefixstudy.costmodel.arch import load_arch
    from prefixstudy.costmodel.roofline import Deployment
    from prefixstudy.costmodel.step_cost import fit, load_steps
    from prefixstudy.costmodel.transfer import roofline_terms
    from prefixstudy.study.simulate import calibration_hardware, mean_context_tokens
    from prefixstudy.workloads import load_rows

    cfg = load_config(STUDIES[2] / "config.yaml")
    arch = load_arch(cfg.model)
    fits = {tp: fit(load_steps(d), source=str(d)) for tp, d in STUDIES.items()}
    ray1 = fit(load_steps(RAY_TP1), source=str(RAY_TP1))
    deps = {tp: Deployment(arch, *calibration_hardware(d)[:2]) for tp, d in STUDIES.items()}
    ctx = 0.0 if "context_tokens" in fits[1].coef_ms else mean_context_tokens(load_rows(cfg))
    roof = {tp: roofline_terms(dep, ctx) for tp, dep in deps.items()}
    ms = profile_ms(PROFILE)
    prof = {tp: prefill_ms_per_token(ms, tp, arch.layers, arch.hidden, deps[tp].gpu.link_gb_s) for tp in (1, 2)}
    # What the roofline transfer gives c0: the source's overhead over its roofline, carried unchanged.
    c0_transfer = fits[1].c0_ms - roof[1]["c0"] + roof[2]["c0"]
    lines = [
        "| term | fit TP 1 | fit TP 1, Ray | fit TP 2, Ray | TP 2 / TP 1 in process | TP 2 / TP 1, both Ray | "
        "roofline transfer | shard profile |",
        "|---|---|---|---|---|---|---|---|",
        f"| c0 (ms a step) | {fits[1].c0_ms:.3f} | {ray1.c0_ms:.3f} | {fits[2].c0_ms:.3f} | "
        f"{fits[2].c0_ms / fits[1].c0_ms:.3f} | {fits[2].c0_ms / ray1.c0_ms:.3f} | {c0_transfer / fits[1].c0_ms:.3f} | - |",
    ]
    for term in fits[1].coef_ms:
        a, b = fits[1].coef_ms[term], fits[2].coef_ms.get(term, float("nan"))
        r = ray1.coef_ms.get(term, float("nan"))
        p = f"{prof[2] / prof[1]:.3f} ({prof[1]:.5f} / {prof[2]:.5f} ms a token)" if term == "prefill_tokens" else "-"
        lines.append(f"| {term} (ms) | {a:.5f} | {r:.5f} | {b:.5f} | {b / a:.3f} | {b / r:.3f} | "
                     f"{roof[2][term] / roof[1][term]:.3f} | {p} |")
    meta = json.loads((PROFILE / "tp_shard_profile.json").read_text())["meta"]
    per_layer = {tp: sum(ms[(tp, op, 1)] for op in LAYER_GEMMS) * arch.layers for tp in (1, 2)}
    lines += [
        "",
        f"Profile: {meta['gpu']}, torch {meta['torch']}, {len(list(PROFILE.glob('tp_shard_profile*.json')))} runs, "
        f"median per shape; GEMM peak measured {meta['measured_gemm_peak_tflops']} TFLOPS, copy "
        f"{meta['measured_copy_gb_s']} GB/s (first run). Ring all-reduce bytes over the datasheet link "
        f"({deps[2].gpu.link_gb_s:.0f} GB/s a direction). Fits: `costmodel.step_cost.fit` on every step of each study "
        f"(h200-tp1 in process, h200-tp1-ray and h200-tp2 through Ray's executor; three leases).",
        "",
        f"One token through the four GEMMs of {arch.layers} layers, each kernel timed alone: "
        f"{per_layer[1]:.2f} ms at TP 1 and {per_layer[2]:.2f} ms at TP 2, more than TP 1's whole fitted c0: "
        "a kernel timed alone pays its launch, which a CUDA-graph replay does not. The profile prices "
        "the prefill term only: "
        f"{prof[1] / fits[1].coef_ms['prefill_tokens']:.0%} (TP 1) and {prof[2] / fits[2].coef_ms['prefill_tokens']:.0%} "
        "(TP 2) of the fitted prefill_tokens.",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args()
    text, path = table(), PROFILE / "ratios.md"
    if a.check:
        if path.read_text() != text:
            sys.exit(f"{path} is not what the committed profile and studies give; run without --check")
        return
    path.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
