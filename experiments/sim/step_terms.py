"""What vLLM's default engine's GPU-timed steps show beside the linear step-cost fit.

    PYTHONPATH=. python experiments/sim/step_terms.py [--check]

Reads h200-tp1's step records (vLLM's default engine, async scheduling, each step timed on the GPU
with CUDA events) and writes experiments/results/sim-accuracy/step-terms.md:

* the linear fit (``costmodel.step_cost.fit_linear``, the GPU part, fitted on every busy step of the study) against
  the measured GPU spans, per point and step kind (with prompt tokens, or decode only): the mean span,
  the mean price, and the price's error on the summed span;
* four effects read straight off the records, each a difference between two groups of real steps
  that differ in one thing, none of which the fit's linear form (c0 + prefill tokens + prefill
  requests + decode tokens) can express;
* where the engine loop outran the GPU: per point, over windows of consecutive steps (the host part's
  own, ``costmodel.step_cost.host_windows``), the share of the loop's time (the summed host records, which tile
  it) that the GPU spans leave idle, the idle time per new request (least squares over the
  windows), and how far the linear fit's price with the measured spans, max(GPU span, its floor host
  part), falls short of the loop.

These are why the simulator prices the default engine with another form (``costmodel.step_cost.fit``:
docs/simulator.md).

``--check`` fails if step-terms.md is not what the committed records give.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from prefixstudy.costmodel.engine_fit import nnls
from prefixstudy.costmodel.step_cost import HOST_WINDOW_STEPS, busy_steps, fit_linear, host_windows, load_steps

REPO = Path(__file__).resolve().parents[2]
STUDY = REPO / "experiments/results/h200-tp1"
OUT = REPO / "experiments/results/sim-accuracy/step-terms.md"
PROMPT = 1214  # the study's prompt length: a step computing one whole prompt has this many prefill tokens
IDLE_GAP_MS = 2.0  # a step that starts this long after the previous record ended follows an idle engine


def steps_of(study: Path) -> pd.DataFrame:
    """Busy steps in time order, with ``gap_ms``: how long the engine was without a step before
    each (infinite for a repeat's first step)."""
    it = load_steps(study).sort_values(["mode", "rate", "repeat", "t_s"], kind="stable")
    prev_end = it.groupby(["mode", "rate", "repeat"])["t_s"].shift(1)
    it["gap_ms"] = ((it["step_start_s"] - prev_end) * 1e3).fillna(np.inf)
    return busy_steps(it)


def by_point(b: pd.DataFrame, priced: np.ndarray) -> pd.DataFrame:
    b = b.assign(priced_ms=priced, kind=np.where(b["prefill_tokens"] > 0, "prompt", "decode only"))
    g = b.groupby(["mode", "rate", "kind"], sort=True)
    out = g.agg(steps=("step_ms", "size"), prefill_tokens=("prefill_tokens", "mean"),
                prefill_reqs=("num_prefill_reqs", "mean"), decode_tokens=("decode_tokens", "mean"),
                gpu_ms=("step_ms", "mean"), priced_ms=("priced_ms", "mean"))
    out["err_pct"] = (g["priced_ms"].sum() / g["step_ms"].sum() - 1) * 100
    return out.reset_index()


def effects(b: pd.DataFrame) -> list[dict]:
    """Each effect: two groups of real steps, their counts and mean GPU spans, and what the difference
    says (per unit where the groups differ in a count)."""
    off, on = b[b["mode"] == "off"], b[b["mode"] == "on"]
    dec = b["prefill_tokens"] == 0
    one_prompt = (b["num_prefill_reqs"] == 1) & (b["prefill_tokens"] == PROMPT)
    rows = []

    def group(name, sel):
        x = b[sel]
        return {"name": name, "n": len(x), "ms": float(x["step_ms"].mean()), "D": float(x["decode_tokens"].mean())}

    # 1. A decoder in a step that also computes a prompt, against one in a decode-only step.
    lo = group("one whole prompt, OFF 16", one_prompt & (b["mode"] == "off") & (b["rate"] == 16))
    hi = group("one whole prompt, OFF 32", one_prompt & (b["mode"] == "off") & (b["rate"] == 32))
    dlo = group("decode only, OFF 16", dec & (b["mode"] == "off") & (b["rate"] == 16))
    dhi = group("decode only, OFF 32", dec & (b["mode"] == "off") & (b["rate"] == 32))
    rows.append({"effect": "a decoder costs more in a step with a prompt", "a": lo, "b": hi,
                 "unit": "ms per decoder", "value": (hi["ms"] - lo["ms"]) / (hi["D"] - lo["D"]),
                 "beside": (dhi["ms"] - dlo["ms"]) / (dhi["D"] - dlo["D"]), "beside_what": "in decode-only steps"})
    # 2. The second whole prompt in a step, against the first.
    two = group("two whole prompts, OFF 16", (b["num_prefill_reqs"] == 2) & (b["prefill_tokens"] == 2 * PROMPT)
                & (b["mode"] == "off") & (b["rate"] == 16))
    rows.append({"effect": "a second prompt in a step costs more than the first", "a": dlo, "b": lo,
                 "unit": "ms, the first prompt", "value": lo["ms"] - dlo["ms"],
                 "beside": two["ms"] - lo["ms"], "beside_what": f"the second ({two['n']} steps: {two['ms']:.2f} ms)"})
    # 3. Decoders that share one cached prefix, against decoders with a prefix each.
    band = dec & b["decode_tokens"].between(140, 170)
    shared = group("decode only, 140-170 decoders, ON", band & (b["mode"] == "on"))
    own = group("decode only, 140-170 decoders, OFF", band & (b["mode"] == "off"))
    rows.append({"effect": "decoders that share a cached prefix cost less", "a": own, "b": shared,
                 "unit": "ms, shared against own", "value": shared["ms"] - own["ms"],
                 "beside": (shared["ms"] - own["ms"]) / own["ms"] * 100, "beside_what": "% of the step"})
    # 4. A prompt step that follows an idle engine, against one that follows another step.
    for mode, sel in (("OFF", off.index), ("ON", on.index)):
        at1 = b.index.isin(sel) & (b["rate"] == 1) & (b["num_prefill_reqs"] == 1)
        busy = group(f"prompt step after a step, {mode} 1", at1 & (b["gap_ms"] <= IDLE_GAP_MS))
        idle = group(f"prompt step after an idle engine, {mode} 1", at1 & (b["gap_ms"] > IDLE_GAP_MS))
        rows.append({"effect": f"the first step after an idle spell is slower ({mode})", "a": busy, "b": idle,
                     "unit": "ms", "value": idle["ms"] - busy["ms"], "beside": np.nan, "beside_what": ""})
    return rows


def loop_idle(b: pd.DataFrame, host: dict) -> pd.DataFrame:
    """Per point: whole windows of consecutive busy steps (``host_windows``), the GPU's idle share of
    the loop's time and idle ms per step, the idle ms per new request (non-negative least squares of
    each window's idle on 1 and its new requests), and the error of max(measured GPU span, ``host``
    part) summed against the loop's time."""
    X = np.column_stack([np.ones(len(b))] + [b[t].to_numpy(float) for t in host["coef_ms"]])
    h = np.array([host["c0_ms"], *host["coef_ms"].values()])
    b = b.assign(win=host_windows(b), priced=np.maximum(b["step_ms"].to_numpy(float), X @ h))
    w = b.groupby("win").agg(mode=("mode", "first"), rate=("rate", "first"), n=("step_ms", "size"),
                             loop=("host_step_ms", "sum"), gpu=("step_ms", "sum"), priced=("priced", "sum"),
                             new=("num_prefill_reqs", "sum"))
    w = w[w["n"] == w["n"].max()]  # whole windows only: a point's last one is cut short
    rows = []
    for (mode, rate), g in w.groupby(["mode", "rate"], sort=True):
        idle = (g["loop"] - g["gpu"]).to_numpy()
        per_new = nnls(np.column_stack([np.ones(len(g)), g["new"].to_numpy(float)]), idle)[1]
        rows.append({"mode": mode, "rate": rate, "windows": len(g), "idle_pct": idle.sum() / g["loop"].sum() * 100,
                     "idle_per_step_ms": idle.sum() / g["n"].sum(), "idle_per_new_ms": per_new,
                     "priced_err_pct": (g["priced"].sum() / g["loop"].sum() - 1) * 100})
    return pd.DataFrame(rows)


def table(study: Path = STUDY) -> str:
    b = steps_of(study)
    model = fit_linear(b, source=str(study), async_scheduling=True)  # the GPU part on the spans, a host floor
    pts = by_point(b, model.predict(b))
    terms = " + ".join(f"{c:.4g}·{t}" for t, c in model.coef_ms.items())
    lines = [f"The GPU part of the linear fit on {study.name} ({len(b):,} busy steps): "
             f"step_ms = {model.c0_ms:.4g} + {terms}. Its price of the real steps, by point and step kind "
             f"(means per step; the error is on the summed span):", "",
             "| mode | rate | steps | kind | prefill tokens | prefill reqs | decode tokens | GPU ms | priced ms | error |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in pts.itertuples():
        lines.append(f"| {r.mode} | {r.rate:g} | {r.steps:,} | {r.kind} | {r.prefill_tokens:.0f} | {r.prefill_reqs:.2f} | "
                     f"{r.decode_tokens:.1f} | {r.gpu_ms:.2f} | {r.priced_ms:.2f} | {r.err_pct:+.1f} % |")
    lines += ["", "What the records show that the fit's form cannot (two groups of real steps each; "
              f"a whole prompt is {PROMPT} prefill tokens; idle: more than {IDLE_GAP_MS:g} ms without a step):", "",
              "| effect | steps A | mean GPU ms (decoders) | steps B | mean GPU ms (decoders) | B against A | beside it |",
              "|---|---|---|---|---|---|---|"]
    for e in effects(b):
        a, c = e["a"], e["b"]
        beside = "" if not e["beside_what"] else (
            f"{e['beside']:+.1f} {e['beside_what']}" if e["beside_what"].startswith("%")
            else f"{e['beside']:.4g} {e['beside_what']}")
        lines.append(f"| {e['effect']} | {a['name']}: {a['n']:,} | {a['ms']:.2f} ({a['D']:.1f}) | {c['name']}: {c['n']:,} | "
                     f"{c['ms']:.2f} ({c['D']:.1f}) | {e['value']:.4g} {e['unit']} | {beside} |")
    host = model.host
    lines += ["", f"Where the engine loop outran the GPU (windows of {HOST_WINDOW_STEPS} "
              "consecutive steps; the loop's time is the summed host records; the host part, fitted on the same "
              f"windows: {host['c0_ms']:.3g} + " + " + ".join(f"{c:.3g}·{t}" for t, c in host["coef_ms"].items()) + " ms):", "",
              "| mode | rate | windows | GPU idle, share of the loop | idle per step | idle per new request "
              "| max(GPU span, host part) against the loop |",
              "|---|---|---|---|---|---|---|"]
    for r in loop_idle(b, host).itertuples():
        lines.append(f"| {r.mode} | {r.rate:g} | {r.windows:,} | {r.idle_pct:.1f} % | {r.idle_per_step_ms:.3f} ms | "
                     f"{r.idle_per_new_ms:.2f} ms | {r.priced_err_pct:+.1f} % |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args()
    text = table()
    if a.check:
        if OUT.read_text() != text:
            sys.exit(f"{OUT} is not what the committed step records give; run without --check")
        return
    OUT.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
