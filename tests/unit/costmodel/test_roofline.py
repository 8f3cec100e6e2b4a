"""prefixstudy.costmodel.roofline: exact FLOPs, bytes and times of the reported case.

Expected numbers are worked out by hand in the comments; tests never re-derive a formula.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from prefixstudy.costmodel import roofline as m
from prefixstudy.costmodel.gpus import get_gpu

REPO = Path(__file__).resolve().parents[3]


def test_prefill_flops_reported_case(mistral, a100x8):
    w = m.prefill_work(mistral, 1214, 0)
    # 2 * 6,979,321,856 * 1214
    assert w.matmul_flops == 16_945_793_466_368
    # lm_head on the last token only: 2 * 134,217,728
    assert w.lm_head_flops == 268_435_456
    # keys = 1214*1215/2 = 737,505; 2 FLOP * 2 (QK,AV) * 32 layers * 4096 * 737,505
    assert w.attention_keys == 737_505
    assert w.attention_flops == 386_665_021_440
    assert w.flops == 17_332_726_923_264
    assert w.flops == pytest.approx(17.6e12, rel=0.03)  # DONE-WHEN: ~17.6 TFLOP within 3 %
    # 17,332,726,923,264 / (8 * 312e12) s
    assert a100x8.ideal_ms(w.flops) == pytest.approx(6.944201491692308, rel=1e-12)
    assert a100x8.ideal_ms(w.flops) == pytest.approx(7.0, rel=0.05)  # DONE-WHEN: ~7 ms within 5 %
    # all logits: 1214 * 268,435,456 instead of 1 * 268,435,456
    assert m.prefill_work(mistral, 1214, 0, all_logits=True).lm_head_flops == 325_880_643_584


def test_prefill_on_cached_prefix_and_saving(mistral, a100x8):
    w = m.prefill_work(mistral, 16, 1198)
    # keys = 16*1198 + 16*17/2 = 19,304; attention 524,288 * 19,304
    assert w.attention_flops == 10_120_855_552
    # 2 * 6,979,321,856 * 16 + 268,435,456 + 10,120,855,552
    assert w.flops == 233_727_590_400
    s = m.prefix_saving(a100x8, 1198, 16, 143)
    assert s.flops == 17_332_726_923_264 - 233_727_590_400
    # 17,098,999,332,864 / 2.496e15 s
    assert a100x8.ideal_ms(s.flops) == pytest.approx(6.850560630153846, rel=1e-12)


def test_decode_step_bytes_comm_and_time(mistral, a100x8):
    w = m.decode_work(mistral, 4, 1000)
    # 2 * (6,979,321,856 + 134,217,728) * 4 + 2*2*32*4096 * 4000
    assert w.flops == 56_908_316_672 + 2_097_152_000
    # weights 7,113,539,584 * 2 B; KV 4000 * 131,072 B
    assert w.weight_bytes == 14_227_079_168
    assert w.kv_bytes == 524_288_000
    assert w.allreduce_bytes == 32_768  # 4 tok * 4096 * 2 B
    t = a100x8.time(w)
    # per GPU: 1,778,384,896 + 65,536,000 = 1,843,920,896 B at 1555 GB/s
    assert t.memory_ms == pytest.approx(1_843_920_896 / 1.555e9, rel=1e-12)
    # 64 calls * (1.75 * 32,768 B / 300 GB/s + 10 us) = 64 * 10.191146667 us
    assert t.comm_ms == pytest.approx(0.6522333866666667, rel=1e-12)
    assert t.bound == "memory"
    assert t.total_ms == pytest.approx(t.memory_ms + t.comm_ms)
    one = m.Deployment(mistral, get_gpu("A100-SXM4-40GB"), tp=1)
    assert one.time(w).comm_ms == 0.0


def test_e2e_and_efficiencies(mistral):
    eff = m.Efficiency(mfu=0.5, bw_eff=0.5, overhead_ms=1.0, allreduce_latency_us=0.0)
    dep = m.Deployment(mistral, get_gpu("H100-SXM"), tp=1, eff=eff)
    r = m.predict_request(dep, 1214, 0, 143)
    # prefill: 17,332,726,923,264 / (989e12 * 0.5) s = 35.051015... ms, compute-bound, + 1 ms overhead
    assert r.prefill.compute_ms == pytest.approx(35.05101501165622, rel=1e-12)
    assert r.prefill.total_ms == pytest.approx(36.05101501165622, rel=1e-12)
    # decode at context 1214 + 71.5: (14,227,079,168 + 1285.5*131,072) B / (3350 GB/s * 0.5) + 1 ms
    assert r.decode_step.total_ms == pytest.approx((14_227_079_168 + 168_493_056) / 1.675e9 + 1.0, rel=1e-12)
    assert r.e2e_ms == pytest.approx(r.prefill.total_ms + 142 * r.decode_step.total_ms)


def test_rate_ceiling(a100x8):
    off = m.rate_ceiling(a100x8, 1214, 0, 143)
    on = m.rate_ceiling(a100x8, 1214, 1198, 143)
    assert off.prefill_rps == pytest.approx(2.496e15 / 17_332_726_923_264, rel=1e-12)  # 144.0 req/s
    assert on.prefill_rps == pytest.approx(2.496e15 / 233_727_590_400, rel=1e-12)
    assert on.engine_rps > off.engine_rps


@pytest.mark.slow
def test_model_module_needs_no_gpu_stack():
    code = ("import sys, prefixstudy.costmodel.roofline, prefixstudy.model.explain, prefixstudy.model.calibrate, "
            "prefixstudy.cli.model; assert not {'torch', 'vllm', 'ray'} & set(sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, env=dict(os.environ))
