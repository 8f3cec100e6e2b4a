"""One transformer layer's operators at the shapes a TP-k shard computes, timed on one GPU.

Vidur's method for tensor parallelism without the GPUs: each GPU of a TP-k group runs the same
operators on 1/k of the heads and of the MLP's columns, so timing those shard shapes on one GPU
gives the compute part of a TP-k step; the all-reduces are modelled apart.  For the model's config
(its ``config.json``), k in 1, 2, 4, 8 and bf16:

* GEMMs per token count n: QKV (hidden x (heads + 2 kv heads) x head_dim / k), O (hidden / k x
  hidden), gate_up (hidden x 2 x intermediate / k), down (intermediate / k x hidden), lm_head
  (hidden x vocab / k, vocab-parallel);
* prefill attention: one causal sequence of n tokens over heads / k (kv heads / k, at least one);
* decode attention: b sequences of one query each over a context of c tokens.

Each shape is the median of CUDA-event times over the runs after warm-up.  A GEMM cycles through
enough copies of its weight to exceed the L2 cache, so a small shard's weight is read from HBM as it
is in a step that runs every layer.  One JSON row per op and shape: ms, FLOPs, bytes moved, and the
same GPU's measured GEMM peak and copy bandwidth, so efficiency against the roofline follows.

    python experiments/gpu/tp_shard_profile.py --config prefixstudy/configs/models/mistral-7b-v0.3/config.json \\
        --out tp_shard_profile.json
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time

import torch
import torch.nn.functional as F

TPS = (1, 2, 4, 8)
TOKENS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
PREFILL_LEN = (128, 512, 1024, 2048, 4096, 8192)
DECODE = [(b, c) for b in (1, 8, 32, 64, 128, 256) for c in (512, 1024, 2048)]
L2_BYTES = 256 * 2**20  # beyond any GPU's L2: each run reads its weight from HBM
WARMUP, RUNS = 5, 30


def timed(fn, runs: int = RUNS) -> float:
    for _ in range(WARMUP):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(runs):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def gemm_ms(n: int, k_in: int, k_out: int, dev) -> float:
    x = torch.randn(n, k_in, device=dev, dtype=torch.bfloat16)
    w_bytes = k_in * k_out * 2
    copies = [torch.randn(k_out, k_in, device=dev, dtype=torch.bfloat16)
              for _ in range(max(1, math.ceil(L2_BYTES / w_bytes)))]
    i = [0]

    def run():
        i[0] = (i[0] + 1) % len(copies)
        F.linear(x, copies[i[0]])

    return timed(run)


def peak_tflops(dev) -> float:
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    ms = timed(lambda: a @ b, runs=20)
    return 2 * 8192**3 / (ms * 1e-3) / 1e12


def copy_gb_s(dev) -> float:
    a = torch.empty(2**30, device=dev, dtype=torch.uint8)
    b = torch.empty_like(a)
    ms = timed(lambda: b.copy_(a), runs=20)
    return 2 * a.numel() / (ms * 1e-3) / 1e9


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    cfg = json.load(open(args.config))
    h, inter, vocab = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d = cfg.get("head_dim") or h // heads
    dev = torch.device("cuda")
    t0 = time.monotonic()
    meta = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "cuda": torch.version.cuda,
            "config": args.config, "dtype": "bfloat16", "runs": RUNS, "warmup": WARMUP,
            "measured_gemm_peak_tflops": round(peak_tflops(dev), 1), "measured_copy_gb_s": round(copy_gb_s(dev), 1)}
    print(json.dumps(meta), flush=True)
    rows = []
    for k in TPS:
        qh, kvh = heads // k, max(1, kv_heads // k)
        gemms = {"qkv": (h, (qh + 2 * kvh) * d), "o": (qh * d, h), "gate_up": (h, 2 * inter // k),
                 "down": (inter // k, h), "lm_head": (h, vocab // k)}
        for op, (k_in, k_out) in gemms.items():
            for n in TOKENS:
                ms = gemm_ms(n, k_in, k_out, dev)
                rows.append({"tp": k, "op": op, "tokens": n, "k_in": k_in, "k_out": k_out, "ms": round(ms, 5),
                             "flops": 2 * n * k_in * k_out, "bytes": 2 * (k_in * k_out + n * (k_in + k_out))})
        for n in PREFILL_LEN:
            q = torch.randn(1, qh, n, d, device=dev, dtype=torch.bfloat16)
            kk, vv = (torch.randn(1, kvh, n, d, device=dev, dtype=torch.bfloat16) for _ in range(2))
            ms = timed(lambda q=q, kk=kk, vv=vv: F.scaled_dot_product_attention(q, kk, vv, is_causal=True, enable_gqa=True))
            rows.append({"tp": k, "op": "prefill_attn", "tokens": n, "ms": round(ms, 5),
                         "flops": 2 * 2 * qh * d * n * n // 2, "bytes": 2 * n * d * (2 * qh + 2 * kvh)})
        for b, c in DECODE:
            q = torch.randn(b, qh, 1, d, device=dev, dtype=torch.bfloat16)
            kk, vv = (torch.randn(b, kvh, c, d, device=dev, dtype=torch.bfloat16) for _ in range(2))
            ms = timed(lambda q=q, kk=kk, vv=vv: F.scaled_dot_product_attention(q, kk, vv, enable_gqa=True))
            rows.append({"tp": k, "op": "decode_attn", "batch": b, "context": c, "ms": round(ms, 5),
                         "flops": 2 * 2 * b * qh * d * c, "bytes": 2 * b * (2 * kvh * c * d + 2 * qh * d)})
        print(f"tp {k}: {len(rows)} rows, {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
    meta["wall_s"] = round(time.monotonic() - t0, 1)
    json.dump({"meta": meta, "rows": rows}, open(args.out, "w"), indent=0)
    print(json.dumps(meta), flush=True)


if __name__ == "__main__":
    main()
