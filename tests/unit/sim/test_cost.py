"""The step-cost fit, the old-layout loader and the roofline transfer, on numbers worked out by hand."""

from __future__ import annotations

import pandas as pd
import pytest

from prefixstudy.model.arch import load_arch
from prefixstudy.model.gpus import get_gpu
from prefixstudy.sim.cost import CostModel, busy_steps, fit, load_steps, step_error
from prefixstudy.sim.hardware import num_gpu_blocks, roofline_terms, transfer

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
    assert num_gpu_blocks(MISTRAL, H200, 1, 0.9, 16) == 52574
    # A100-40GB at TP 8: (36e9 - 1.812e9 - 2 GiB) / (16 x 16,384 B) = 122,224.6
    assert num_gpu_blocks(MISTRAL, A100, 8, 0.9, 16) == 122224


def test_roofline_terms_of_mistral_on_h200():
    r1, r2 = roofline_terms(MISTRAL, H200, 1, 0.0), roofline_terms(MISTRAL, H200, 2, 0.0)
    assert r1["prefill_tokens"] == pytest.approx(0.0146573, rel=1e-5)  # 2 x 7.248e9 FLOPs / 989 TFLOPS
    assert r1["c0"] == pytest.approx(3.020010)  # 14.5 GB of weights / 4.8 TB/s
    # TP 2: half the FLOPs, + 64 all-reduces of 4096 x 2 B, half of it sent each way, at 450 GB/s
    assert r2["prefill_tokens"] == pytest.approx(0.0073286 + 0.0011651, rel=1e-4)
    assert r2["c0"] == pytest.approx(1.510005 + 64 * 0.010, rel=1e-6)


def test_transfer_keeps_efficiency_and_overhead():
    m = CostModel(4.5, {"prefill_tokens": 0.0211, "decode_tokens": 0.065})
    assert transfer(m, MISTRAL, (H200, 1), (H200, 1), 1285.5).coef_ms == pytest.approx(m.coef_ms)
    t = transfer(m, MISTRAL, (H200, 1), (H200, 2), 1285.5)
    # overhead 4.5 - 3.020 ms stays; the TP 2 roofline c0 is 1.510 + 0.640 ms
    assert t.c0_ms == pytest.approx(4.5 - 3.020010 + 2.150005, rel=1e-6)
    assert t.coef_ms["prefill_tokens"] == pytest.approx(0.0211 * 0.0084937 / 0.0146573, rel=1e-4)
