"""model.closure: TPOT = a / (1 - λ·w), the instability rate 1000 / w, and the knee where the requests
in the engine reach 80 % of its admission limit, on numbers worked by hand."""

from __future__ import annotations

import math

import pytest

from prefixstudy.model import closure as cl

COEF = (4.0, 0.02, 1.0, 0.05, 0.0)  # a ms a step, b per prompt token, e per prefill, c per decode token, k


def test_a_requests_work_and_the_tpot_it_implies():
    w = cl.request_work_ms(COEF, prompt=1214, cached=1184, output=143)
    assert w == pytest.approx(0.02 * 30 + 1.0 + 142 * 0.05)  # 8.7 ms
    assert cl.tpot_ms(COEF, w, 50.0) == pytest.approx(4.0 / (1 - 50 * 8.7 / 1e3))
    assert cl.tpot_ms(COEF, w, 1e3 / 8.7) == math.inf


def test_the_knee_is_the_lower_of_instability_and_a_full_engine():
    w = cl.request_work_ms(COEF, 1214, 0, 143)  # 32.38 ms: unstable at 30.9 req/s
    free = cl.arm_prediction(COEF, 1214, 0, 143, ttft_ms=40.0, limit=None)
    assert free["unstable_rate"] == pytest.approx(1e3 / w) and math.isnan(free["full_rate"])
    assert free["knee_rate"] == free["unstable_rate"]
    tight = cl.arm_prediction(COEF, 1214, 0, 143, ttft_ms=40.0, limit=20)
    # 16 requests in the engine: λ (40 + 142·4 / (1 - λ·w)) / 1000 = 16 first holds at 14.5 req/s
    lam = tight["full_rate"]
    assert lam == pytest.approx(14.47, abs=0.02) and tight["knee_rate"] == lam
    assert lam * (40.0 + 142 * cl.tpot_ms(COEF, w, lam)) / 1e3 == pytest.approx(16.0, rel=0.01)


def test_the_coefficients_beside_the_datasheet_floors_of_their_work():
    from prefixstudy.configs import shipped_model_dir
    from prefixstudy.costmodel.arch import load_arch
    from prefixstudy.costmodel.gpus import get_gpu

    arch, gpu = load_arch(shipped_model_dir("mistral-7b-v0.3")), get_gpu("NVIDIA H200")
    t = cl.physics((4.40, 0.0218, 1.35, 0.0551, 0.0), arch, gpu, context_tokens=1286).set_index("coefficient")
    params = arch.matmul_params + arch.lm_head_params
    assert t.loc["a_ms", "floor_ms"] == pytest.approx(2 * params / (gpu.hbm_gb_s * 1e9) * 1e3)  # bf16 weights, once
    assert t.loc["b_ms_per_prefill_token", "floor_ms"] == pytest.approx(2 * arch.matmul_params / (gpu.bf16_tflops * 1e12) * 1e3)
    assert t.loc["e_ms_per_prefill_req", "floor_ms"] == 0.0 and t.loc["e_ms_per_prefill_req", "share"] == 0.0
    kv = 1286 * arch.kv_bytes_per_token(2) / (gpu.hbm_gb_s * 1e9) * 1e3  # slower than its FLOPs at this context
    assert t.loc["c_ms_per_decode_token", "floor_ms"] == pytest.approx(kv)
    assert [round(x, 2) for x in t["share"]] == [0.67, 0.65, 0.0, 0.64]
