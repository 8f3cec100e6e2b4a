"""Stage: cost model.  The roofline's efficiencies (mfu, bw_eff, a per-step overhead) fitted to a
study's measured requests and engine steps, given as frames: ``fit_efficiency``.

``model.calibrate`` reads the study's folder, picks its unsaturated points and calls it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from prefixstudy.costmodel.roofline import Deployment, Efficiency, decode_work, prefill_work
from prefixstudy.errors import UserError


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


def decode_steps(iterations: pd.DataFrame, points: list[tuple[str, float]]) -> pd.DataFrame:
    """Pure decode iterations (no prompt tokens) of the given points, batch = generation_tokens."""
    cols = ["mode", "rate", "prompt_tokens", "generation_tokens", "step_ms"]
    it = iterations
    if it.empty or any(c not in it for c in cols):
        return pd.DataFrame(columns=cols)
    keep = [(m, r) in set(points) for m, r in zip(it["mode"].astype(str), it["rate"].astype(float), strict=True)]
    it = it[keep]
    it = it[(it["prompt_tokens"] == 0) & (it["generation_tokens"] > 0)]
    return it[it["step_ms"].notna() & (it["step_ms"] > 0)]


@dataclass
class _Decode:
    """Decode points (x: memory ms at 100 % HBM, y: measured step minus comm, w: weight)."""

    xs: list[float]
    ys: list[float]
    ws: list[float]


def _decode_points(steps: pd.DataFrame, ok: pd.DataFrame, points: list[tuple[str, float]],
                   peak: Deployment, ctx: float, notes: list[str]) -> _Decode:
    xs, ys, ws = [], [], []
    for b, grp in steps.groupby("generation_tokens"):
        t = peak.time(decode_work(peak.arch, float(b), ctx, peak.dtype_bytes))
        if t.compute_ms >= t.memory_ms:
            continue  # compute-bound at this batch: says nothing about bandwidth
        xs.append(t.memory_ms)
        ys.append(float(grp["step_ms"].median()) - t.comm_ms)
        ws.append(len(grp))
    if not xs:
        # No iteration records: per-request decode steps at the lowest rate, as batch 1.
        low = min(r for _, r in points)
        dec = ok[(ok["output_tokens"] > 1) & (ok["rate"].astype(float) == low)
                 & ok["mode"].isin([md for md, r in points if r == low])]
        if dec.empty:
            raise UserError("requests.parquet: no request with more than one output token to fit decode")
        t = peak.time(decode_work(peak.arch, 1.0, ctx, peak.dtype_bytes))
        step = float((dec["decode_ms"] / (dec["output_tokens"] - 1)).mean())
        xs, ys, ws = [t.memory_ms], [step - t.comm_ms], [len(dec)]
        notes.append(f"no pure-decode iteration records: decode fitted to per-request steps at "
                     f"{low:g} req/s, taken as batch 1")
    return _Decode(xs, ys, ws)


def _fit_decode(d: _Decode, overhead: float, min_spread: float,
                notes: list[str]) -> tuple[float, float, bool]:
    """bw_eff, overhead, whether the overhead was fitted (else held at the given one)."""
    xs, ys, ws = d.xs, d.ys, d.ws
    if len(xs) >= 2 and (max(xs) - min(xs)) / float(np.mean(xs)) >= min_spread:
        slope, overhead = np.polyfit(xs, ys, 1, w=np.sqrt(ws))
        overhead = float(overhead)
        if overhead < 0:
            notes.append(f"fitted overhead is negative ({overhead:.3f} ms): noise or a model gap")
        return 1.0 / float(slope), overhead, True
    x = float(np.average(xs, weights=ws))
    y = float(np.average(ys, weights=ws))
    notes.append(f"decode batch sizes span too little memory traffic to separate overhead "
                 f"from bandwidth: overhead held at {overhead:g} ms")
    return x / (y - overhead), overhead, False


def _fit_prefill(ok: pd.DataFrame, points: list[tuple[str, float]], peak: Deployment, bw_eff: float,
                 overhead: float, notes: list[str]) -> tuple[float, bool, str]:
    """mfu from OFF (or the only mode) at the lowest unsaturated rate; whether fitted; the point."""
    mode = "off" if any(m == "off" for m, _ in points) else points[0][0]
    rate = min(r for m, r in points if m == mode)
    pre = ok[(ok["mode"] == mode) & (ok["rate"].astype(float) == rate)]
    point = f"{mode} {rate:g} req/s"
    if pre.empty:
        notes.append(f"no measured request at {point}: mfu held at 1")
        return 1.0, False, point
    cached = float(pre["num_cached_tokens"].mean())
    new = float(pre["prompt_tokens"].mean()) - cached
    t = peak.time(prefill_work(peak.arch, new, cached, peak.dtype_bytes))
    compute_ms = float(pre["prefill_ms"].mean()) - t.comm_ms - overhead
    if compute_ms > t.memory_ms / bw_eff:
        return t.compute_ms / compute_ms, True, point
    notes.append(f"prefill at {point} is memory-bound or faster than "
                 f"the model: mfu not identifiable, held at 1")
    return 1.0, False, point


def fit_efficiency(points: list[tuple[str, float]], ok: pd.DataFrame, iterations: pd.DataFrame,
                   dep: Deployment, min_spread: float = 0.02) -> Fit:
    """Fit bw_eff and the per-step overhead to decode steps, then mfu to the OFF prefill.

    ``points``: the (mode, rate) points to fit, unsaturated; ``ok``: their counted requests (measured,
    without an error); ``iterations``: the engine's steps.

    Decode: for each batch size B among the pure-decode iterations of the points, the median step
    time y_B is modelled as ``overhead + x_B / bw_eff + comm_B``, with x_B the memory time at 100 %
    HBM bandwidth (only memory-bound B, below the roofline ridge).  A weighted least-squares line
    gives both; when the x_B span less than ``min_spread`` (relative) the two cannot be told apart
    and the overhead keeps ``dep.eff.overhead_ms``.  Prefill: the mean engine-side prefill_ms of OFF
    at the lowest rate, minus comm and overhead, is compute at ``mfu``.
    """
    notes: list[str] = []
    peak = dep.with_eff(Efficiency(allreduce_latency_us=dep.eff.allreduce_latency_us))
    ctx = float(ok["prompt_tokens"].mean() + ok["output_tokens"].mean() / 2)
    d = _decode_points(decode_steps(iterations, points), ok, points, peak, ctx, notes)
    bw_eff, overhead, overhead_fitted = _fit_decode(d, dep.eff.overhead_ms, min_spread, notes)
    mfu, mfu_fitted, point = _fit_prefill(ok, points, peak, bw_eff, overhead, notes)
    eff = Efficiency(mfu, bw_eff, overhead, dep.eff.allreduce_latency_us)
    return Fit(eff, mfu_fitted, overhead_fitted, len(d.xs), int(sum(d.ws)), point, notes)
