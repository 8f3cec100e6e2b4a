"""The step-cost fit, the old-layout loader and the roofline transfer (GPU, TP, model), on numbers worked out
by hand."""

from __future__ import annotations

import pickle
from dataclasses import replace

import pandas as pd
import pytest

from prefixstudy.costmodel.arch import load_arch
from prefixstudy.costmodel.gpus import get_gpu
from prefixstudy.costmodel.step_cost import CostModel, busy_steps, fit, load_steps, step_error
from prefixstudy.costmodel.roofline import Deployment, num_gpu_blocks
from prefixstudy.costmodel.transfer import extrapolations, roofline_terms, same_model, transfer

from pathlib import Path

REPO = Path(__file__).resolve().parents[3]

MISTRAL = load_arch(REPO / "prefixstudy/configs/models/mistral-7b-v0.3")
H200, A100 = get_gpu("H200-SXM"), get_gpu("A100-SXM4-40GB")


def engine_steps(rows):
    """rows of (prefill, decode, context): step_ms = 2 + 0.01 prefill + 0.05 decode + 0.0001 context."""
    df = pd.DataFrame(rows, columns=["prefill_tokens", "decode_tokens", "context_tokens"])
    df["step_ms"] = 2 + 0.01 * df.prefill_tokens + 0.05 * df.decode_tokens + 0.0001 * df.context_tokens
    df["mode"], df["rate"], df["repeat"], df["timing"] = "on", 1.0, 0, "engine"
    return df


def test_fit_recovers_the_coefficients_exactly():
    df = engine_steps([(100, 0, 100), (0, 4, 4000), (50, 2, 2500), (0, 8, 9000), (1000, 1, 2200), (0, 1, 300)])
    m = fit(df)
    assert m.c0_ms == pytest.approx(2.0, abs=1e-9)
    assert m.coef_ms == pytest.approx({"prefill_tokens": 0.01, "decode_tokens": 0.05, "context_tokens": 0.0001})
    assert m.r2 == pytest.approx(1.0) and m.n_steps == 6 and m.timing == "engine"
    assert step_error(m, df)["total_rel_err"] == pytest.approx(0.0, abs=1e-12)


def test_a_term_that_comes_out_negative_is_dropped_and_the_rest_refitted():
    """Context costing less than nothing (here by construction) is not physical: it goes, and the
    prefill and decode terms are the least-squares fit without it."""
    import numpy as np

    df = engine_steps([(100, 0, 100), (0, 4, 4000), (50, 2, 2500), (0, 8, 9000), (1000, 1, 2200), (0, 1, 300)])
    df["step_ms"] -= 0.00012 * df.context_tokens  # now 2 + 0.01 p + 0.05 d - 0.00002 c
    x = np.column_stack([np.ones(len(df)), df.prefill_tokens, df.decode_tokens])
    c0, cp, cd = np.linalg.lstsq(x, df.step_ms.to_numpy(), rcond=None)[0]
    m = fit(df)
    assert set(m.coef_ms) == {"prefill_tokens", "decode_tokens"} and min(m.coef_ms.values()) >= 0
    assert (m.c0_ms, m.coef_ms["prefill_tokens"], m.coef_ms["decode_tokens"]) == pytest.approx((c0, cp, cd))
    assert cd == pytest.approx(0.0269, abs=1e-4)  # decode absorbs the (negative) KV read


def test_a_saved_model_prices_the_same(tmp_path):
    m = CostModel(2.0, {"prefill_tokens": 0.01, "decode_tokens": 0.05}, r2=0.9)
    m.save(tmp_path / "c.json")
    back = CostModel.load(tmp_path / "c.json")
    assert back == m and back.predict(engine_steps([(100, 2, 0)]))[0] == pytest.approx(3.1)


def test_old_layout_is_mapped_and_idle_gaps_dropped(tmp_path):
    """Frontend timing: a record's step_ms is the gap since the previous record.  Kept: records with
    work whose previous record of the same point had work too."""
    old = pd.DataFrame({
        "mode": ["on"] * 6, "rate": [1.0] * 6,
        "step_ms": [float("nan"), 5.0, 0.1, 900.0, 6.0, 5.0],  # 900: the idle gap before a request
        "prompt_tokens": [30, 0, 0, 30, 0, 0], "generation_tokens": [1, 1, 0, 1, 1, 1],
        "num_running": [1, 1, 0, 1, 1, 1], "num_waiting": [0] * 6,
    })
    (tmp_path / "iterations.parquet").mkdir()
    old.to_parquet(tmp_path / "iterations.parquet" / "on-1.parquet")
    df = load_steps(tmp_path)
    assert list(df.prefill_tokens) == [30, 0, 0, 30, 0, 0] and list(df.decode_tokens) == [1, 1, 0, 1, 1, 1]
    assert set(df.timing) == {"frontend"}
    assert list(busy_steps(df).index) == [1, 4, 5]  # 0: first record; 2: no work; 3: after a record without work


def test_h200_block_count():
    # (141e9 B x 0.9 - 7,248,023,552 params x 2 B - 2 GiB) / (16 tokens x 131,072 B) = 52,574.4
    assert num_gpu_blocks(Deployment(MISTRAL, H200, 1), 0.9, 16) == 52574
    # A100-40GB at TP 8: (36e9 - 1.812e9 - 2 GiB) / (16 x 16,384 B) = 122,224.6
    assert num_gpu_blocks(Deployment(MISTRAL, A100, 8), 0.9, 16) == 122224


def test_roofline_terms_of_mistral_on_h200():
    r1, r2 = roofline_terms(Deployment(MISTRAL, H200, 1), 0.0), roofline_terms(Deployment(MISTRAL, H200, 2), 0.0)
    assert r1["prefill_tokens"] == pytest.approx(0.0141139, rel=1e-5)  # 2 x 6.979e9 projection FLOPs / 989 TFLOPS
    assert r1["c0"] == pytest.approx(2.963975, rel=1e-6)  # (6.979e9 + 0.134e9 lm_head) x 2 B / 4.8 TB/s
    # TP 2: half the FLOPs, + 64 all-reduces of 4096 x 2 B, half of it sent each way, at 450 GB/s
    assert r2["prefill_tokens"] == pytest.approx(0.0070569 + 0.0011651, rel=1e-4)
    assert r2["c0"] == pytest.approx(1.4819874 + 64 * 0.010, rel=1e-6)


def test_transfer_keeps_efficiency_and_overhead():
    m = CostModel(4.5, {"prefill_tokens": 0.0211, "decode_tokens": 0.065})
    same = transfer(m, Deployment(MISTRAL, H200, 1), Deployment(MISTRAL, H200, 1), 1285.5)
    assert same.coef_ms == pytest.approx(m.coef_ms) and same.c0_ms == pytest.approx(4.5)
    t = transfer(m, Deployment(MISTRAL, H200, 1), Deployment(MISTRAL, H200, 2), 1285.5)
    # overhead 4.5 - 2.964 ms stays; the TP 2 roofline c0 is 1.482 + 0.640 ms
    assert t.c0_ms == pytest.approx(4.5 - 2.963975 + 2.1219874, rel=1e-6)
    assert t.coef_ms["prefill_tokens"] == pytest.approx(0.0211 * 0.0082220 / 0.0141139, rel=1e-4)
    assert t.transfer["c0_overhead_ms"] == pytest.approx(4.5 - 2.963975, rel=1e-6)


# Mistral's projections: 32 layers x 104 x 2^21 weights; its lm_head: 64 x 2^21 (32768 x 4096).
# Twice the layers at the same width: (2 x 3328 + 64) / (3328 + 64) = 105/53 of the weights.
DEEP = replace(MISTRAL, layers=64)
FIT = CostModel(4.5, {"prefill_tokens": 0.02, "num_prefill_reqs": 0.36, "decode_tokens": 0.07,
                      "context_tokens": 1e-5})


def test_twice_the_layers_at_the_same_width_scales_each_term_by_hand():
    """With a context term the decode coefficient is projection and lm_head FLOPs only."""
    assert MISTRAL.matmul_params == 3328 * 2**21 and MISTRAL.lm_head_params == 64 * 2**21
    t = transfer(FIT, Deployment(MISTRAL, H200, 1), Deployment(DEEP, H200, 1), 1285.5)
    assert t.transfer["scale"] == pytest.approx({"c0": 105 / 53, "prefill_tokens": 2.0, "num_prefill_reqs": 2.0,
                                                 "decode_tokens": 105 / 53, "context_tokens": 2.0}, rel=1e-12)
    assert t.coef_ms == pytest.approx({"prefill_tokens": 0.04, "num_prefill_reqs": 0.72,
                                       "decode_tokens": 0.07 * 105 / 53, "context_tokens": 2e-5}, rel=1e-12)
    # The host overhead is carried; only the weight read of c0 doubles (less the shared lm_head).
    assert t.c0_ms == pytest.approx(4.5 - 2.963975 + 2.963975 * 105 / 53, rel=1e-6)


def test_a_piecewise_gpu_part_prices_its_row_segments_and_a_prompt_step_by_hand(tmp_path):
    """A step of one 1214-token prompt beside 20 decoders has 1234 GEMM rows: 64 in each of the first
    two segments, 128, 256, 512, then 210 in the 1024-2048 segment; records price it the same way."""
    from prefixstudy.costmodel.step import ROW_TERMS, StepFeatures

    assert ROW_TERMS[:2] == ("rows_0_64", "rows_64_128") and ROW_TERMS[-1] == "rows_8192_16384" and len(ROW_TERMS) == 9
    m = CostModel(4.0, {"rows_0_64": 0.01, "rows_1024_2048": 0.02, "decode_tokens": 0.05, "prompt_step": 2.0,
                        "kv_tokens": 1e-5})
    prompt = StepFeatures(1214, 20, 0, 21, num_prefill_reqs=1, kv_tokens=100_000)
    assert m(prompt) == pytest.approx(4.0 + 0.64 + 4.2 + 1.0 + 2.0 + 1.0)
    assert m(StepFeatures(0, 20, 0, 20)) == pytest.approx(4.0 + 0.2 + 1.0)  # no prompt: no prompt_step
    # the segments priced in order of their rows, whatever order the model lists them in
    backwards = CostModel(4.0, dict(reversed(m.coef_ms.items())))
    assert backwards(prompt) == pytest.approx(m(prompt)) and backwards(StepFeatures(0, 20, 0, 20)) == pytest.approx(5.2)
    rows = pd.DataFrame({"prefill_tokens": [1214, 0], "decode_tokens": [20, 20], "kv_tokens": [100_000, 0]})
    assert m.predict(rows) == pytest.approx([12.84, 5.2])
    # as the simulator's worker processes and a saved cost_model.json get it
    assert pickle.loads(pickle.dumps(m))(prompt) == m(prompt)
    m.save(tmp_path / "m.json")
    assert CostModel.load(tmp_path / "m.json")(prompt) == m(prompt)


def test_a_piecewise_gpu_part_transfers_each_derived_term_as_the_work_it_is():
    """Twice the layers: a segment of GEMM rows scales as a prompt token (x 2), a prompt step as a
    prompt request (x 2, L units), the KV a step holds as a context token (x 2); with the KV term the
    decode coefficient carries no KV read (105/53)."""
    m = CostModel(4.5, {"rows_0_64": 0.02, "rows_64_128": 0.02, "prompt_step": 1.5, "kv_tokens": 1e-5,
                        "decode_tokens": 0.04})
    t = transfer(m, Deployment(MISTRAL, H200, 1), Deployment(DEEP, H200, 1), 1285.5)
    assert t.transfer["scale"] == pytest.approx({"c0": 105 / 53, "rows_0_64": 2.0, "rows_64_128": 2.0,
                                                 "prompt_step": 2.0, "kv_tokens": 2.0, "decode_tokens": 105 / 53},
                                                rel=1e-12)
    assert t.transfer["mean_context_tokens"] == 0.0


def test_twice_the_layers_at_tp2_doubles_the_all_reduces_too():
    """TP 2: prefill is FLOPs + all-reduce bytes, both x 2 with the layers; c0's all-reduce
    latencies (2 per layer) double, its weight read grows 105/53."""
    t = transfer(FIT, Deployment(MISTRAL, H200, 2), Deployment(DEEP, H200, 2), 1285.5)
    assert t.transfer["scale"]["prefill_tokens"] == pytest.approx(2.0, rel=1e-12)
    assert t.transfer["scale"]["c0"] == pytest.approx((1.4819874 * 105 / 53 + 128 * 0.010) / 2.1219874, rel=1e-6)


def test_without_a_context_term_decode_scales_with_its_kv_read():
    """The decode coefficient carries the mean KV read: at 1285.5 context tokens, FLOPs
    2 x 7.114e9 / 989e12 s and KV 1285.5 x 131,072 B / 4.8e12 B/s on Mistral, both grown for DEEP."""
    m = CostModel(4.5, {"prefill_tokens": 0.02, "decode_tokens": 0.07})
    t = transfer(m, Deployment(MISTRAL, H200, 1), Deployment(DEEP, H200, 1), 1285.5)
    flops_ms, kv_ms = 2 * 7113539584 / 989e12 * 1e3, 1285.5 * 131072 / 4.8e12 * 1e3
    assert t.transfer["scale"]["decode_tokens"] == pytest.approx(
        (flops_ms * 105 / 53 + 2 * kv_ms) / (flops_ms + kv_ms), rel=1e-12)


def test_fewer_kv_heads_halve_the_context_term_and_are_named_as_an_extrapolation():
    gqa = replace(MISTRAL, kv_heads=4)
    t = transfer(FIT, Deployment(MISTRAL, H200, 1), Deployment(gqa, H200, 1), 1285.5)
    assert t.transfer["scale"]["context_tokens"] == pytest.approx(0.5, rel=1e-12)
    assert extrapolations(MISTRAL, gqa) == [
        "attention layout differs (query heads per KV head 8 vs 4, head_dim 128 vs 128): the attention kernels' "
        "efficiency is carried from another layout"]
    # TP 8 over 4 KV heads: each GPU holds one whole head (vLLM replicates them), a quarter of the KV.
    assert roofline_terms(Deployment(gqa, H200, 8), 0.0)["context_tokens"] == pytest.approx(
        65536 / 4 / 4.8e12 * 1e3, rel=1e-12)


def test_a_model_beyond_twice_the_weights_is_named_as_an_extrapolation():
    assert extrapolations(MISTRAL, MISTRAL) == [] and extrapolations(MISTRAL, DEEP) == []  # 105/53 = 1.98x
    assert extrapolations(MISTRAL, replace(MISTRAL, layers=96)) == [
        "the target has 2.96x the calibration model's weights: its GEMMs run at shapes whose efficiency was "
        "not measured"]
    assert same_model(MISTRAL, replace(MISTRAL, name="a copy")) and not same_model(MISTRAL, DEEP)
