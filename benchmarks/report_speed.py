"""How long does ``prefixstudy report`` take on a big study?

Builds a synthetic study (default 20 rates x 2 modes, 1000 requests per point,
following prefixstudy.schema), then times ``build_report`` N times and prints the
median.  Target: < 15 s on 2 cores.

    python benchmarks/report_speed.py [--rates 20] [--requests 1000] [--runs 3]

``write_synthetic_study`` is also used by tests/unit/report/test_report.py.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from prefixstudy.metrics.summary import summarize
from prefixstudy.results import (CONFIG, ITERATIONS, MANIFEST, REQUESTS, SUMMARY, atomic_write_csv,
                                 atomic_write_parquet, atomic_write_text, typed_iterations,
                                 typed_requests, write_json)

# Synthetic engine: ON prefills only the suffix, so it serves more req/s.
CAPACITY = {"on": 12.0, "off": 6.0}  # req/s the engine can sustain
PREFILL_MS = {"on": 8.0, "off": 60.0}
DECODE_MS = 120.0
STEP = (2.0, 0.01, 0.05)  # step_ms = a + b*prompt_tokens + c*generation_tokens (exact)
PROMPT, SUFFIX, OUTPUT = 1198, 16, 32


def synthetic_point(mode: str, rate: float, n: int, rng: np.random.Generator, warmup: int = 2):
    """Requests and iterations of one point of a single-server queue with capacity CAPACITY[mode]."""
    mu = CAPACITY[mode]
    i = np.arange(-warmup, n)
    sched = np.maximum(i, 0) / rate + rng.uniform(0, 0.2 / rate, size=i.size)
    sent = sched + rng.uniform(0, 0.002, size=i.size)
    # FIFO single server with service 1/mu: start_k = max(arrival_k, start_{k-1} + 1/mu).
    start = np.empty_like(sent)
    prev = -np.inf
    for k, a in enumerate(sent):
        prev = max(a, prev + 1.0 / mu)
        start[k] = prev
    queue = (start - sent) * 1000
    prefill = PREFILL_MS[mode] * rng.uniform(0.9, 1.1, size=i.size)
    decode = DECODE_MS * rng.uniform(0.9, 1.1, size=i.size)
    ttft = queue + prefill + 0.5
    e2e = ttft + decode
    cached = PROMPT - SUFFIX if mode == "on" else 0
    req = pd.DataFrame({
        "mode": mode, "rate": rate, "request_index": i, "request_id": [f"{mode}-{rate:g}-{k}" for k in i],
        "group": 0, "warmup": i < 0, "prompt_tokens": PROMPT, "output_tokens": OUTPUT,
        "num_cached_tokens": cached, "expected_cached_tokens": cached, "scheduled_s": sched, "sent_s": sent,
        "dispatch_lag_ms": (sent - sched) * 1000, "ttft_ms": ttft, "tpot_ms": decode / (OUTPUT - 1),
        "e2e_ms": e2e, "itl_mean_ms": decode / (OUTPUT - 1), "itl_p50_ms": decode / (OUTPUT - 1),
        "itl_p99_ms": 1.5 * decode / (OUTPUT - 1), "itl_max_ms": 2 * decode / (OUTPUT - 1),
        "queue_ms": queue, "prefill_ms": prefill, "decode_ms": decode, "error": "",
    })
    end = float((sent + e2e / 1000).max())
    t = np.arange(0.0, end, 0.05)
    waiting = np.array([(sent[i >= 0] <= x).sum() - (start[i >= 0] <= x).sum() for x in t])
    running = np.array([((start <= x) & (sent + e2e / 1000 > x)).sum() for x in t])
    p_tok = rng.integers(0, 3, size=t.size) * (PROMPT - cached)
    g_tok = np.maximum(running, 0) + rng.integers(0, 2, size=t.size)
    step = STEP[0] + STEP[1] * p_tok + STEP[2] * g_tok
    step = np.concatenate([[np.nan], step[1:]])
    it = pd.DataFrame({
        "mode": mode, "rate": rate, "t_s": t, "step_ms": step, "num_running": running,
        "num_waiting": waiting, "kv_cache_usage": np.clip(running / 64, 0, 1),
        "prefix_queries": p_tok + (cached if mode == "on" else 0) * (p_tok > 0),
        "prefix_hits": (cached if mode == "on" else 0) * (p_tok > 0), "prefill_tokens": p_tok,
        "decode_tokens": g_tok, "timing": "frontend", "step_start_s": t - step / 1e3,
    })
    return req, it


def write_synthetic_study(root: Path, rates=(1.0, 2.0, 4.0, 8.0), n_requests: int = 40, seed: int = 0,
                          study: str = "synthetic", device: str = "cpu", tp: int = 1,
                          failed: tuple = ()) -> Path:
    """A results folder ``root/<study>/run-0`` that follows prefixstudy.schema.

    ``failed``: (mode, rate, error) points the manifest and summary record as failed,
    with no requests.
    """
    rng = np.random.default_rng(seed)
    run = Path(root) / study / "run-0"
    reqs, its = [], []
    for mode in ("on", "off"):
        for rate in rates:
            r, i = synthetic_point(mode, float(rate), n_requests, rng)
            reqs.append(r)
            its.append(i)
    req = typed_requests(pd.concat(reqs, ignore_index=True))
    it = typed_iterations(pd.concat(its, ignore_index=True))
    points = [{"mode": m, "rate": float(r), "status": "ok", "error": "", "n_sent": n_requests}
              for m in ("on", "off") for r in rates]
    points += [{"mode": m, "rate": float(r), "status": "failed", "error": e, "n_sent": 0} for m, r, e in failed]
    summ = summarize(req, points)
    atomic_write_parquet(run / REQUESTS, req)
    atomic_write_parquet(run / ITERATIONS, it)
    atomic_write_csv(run / SUMMARY, summ)
    atomic_write_text(run / CONFIG, (
        f"study: {study}\nmodel: tiny-llama\ndevice: {device}\n"
        f"engine:\n  tensor_parallel_size: {tp}\n"
        f"dataset:\n  prefix_len: {PROMPT - SUFFIX}\n  suffix_len: {SUFFIX}\n  output_len: {OUTPUT}\n  groups: 1\n"
        f"arrivals:\n  process: constant\n  burstiness: 1.0\n"
        f"sweep:\n  rates: [{', '.join(f'{r:g}' for r in rates)}]\n"))
    write_json(run / MANIFEST, {
        "prefixstudy_version": "0.1.0", "vllm_version": "synthetic", "torch_version": "n/a",
        "ray_version": "n/a", "device": device, "started_at": "2025-01-01T00:00:00Z",
        "ended_at": "2025-01-01T01:00:00Z", "status": "ok",
        "points": points,
    })
    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", type=int, default=20)
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    from prefixstudy.report import build_report

    with tempfile.TemporaryDirectory() as tmp:
        rates = [round(0.5 * (k + 1), 3) for k in range(args.rates)]
        t0 = time.perf_counter()
        run = write_synthetic_study(Path(tmp), rates, args.requests)
        print(f"synthetic study: {len(rates)} rates x 2 modes x {args.requests} requests "
              f"({time.perf_counter() - t0:.1f} s to build)")
        times = []
        for k in range(args.runs):
            t0 = time.perf_counter()
            build_report(run)
            times.append(time.perf_counter() - t0)
            print(f"run {k + 1}: {times[-1]:.2f} s")
        print(f"median build_report: {statistics.median(times):.2f} s over {args.runs} runs")


if __name__ == "__main__":
    main()
