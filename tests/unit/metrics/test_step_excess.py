"""metrics.step_excess: a mixed step's excess over the median decode-only step of its decode batch
size, on hand-made steps whose answer is known exactly, and on wrong data it must leave unpriced."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from prefixstudy.metrics import gain_split as gs, step_excess as se
from prefixstudy.schema import typed_iterations, typed_requests


def _steps(decode: list[int], prefill: list[int], ms: list[float], mode: str = "off") -> pd.DataFrame:
    """Back-to-back steps from t = 0 of one point."""
    ms_ = np.asarray(ms, float)
    ends = np.cumsum(ms_) / 1e3
    return typed_iterations(pd.DataFrame({
        "mode": mode, "rate": 16.0, "repeat": 0, "timing": "gpu-span", "step_start_s": ends - ms_ / 1e3, "t_s": ends,
        "step_ms": ms_, "prefill_tokens": prefill, "num_prefill_reqs": [int(p > 0) for p in prefill],
        "decode_tokens": decode, "cached_tokens": 0}))


def _request(first_s: float, last_s: float, mode: str = "off") -> pd.DataFrame:
    return typed_requests(pd.DataFrame({
        "mode": [mode], "rate": 16.0, "repeat": 0, "request_index": 0, "request_id": "r0", "warmup": False,
        "prompt_tokens": 1214, "output_tokens": 9, "sent_s": 0.0, "ttft_ms": 1e3 * first_s, "e2e_ms": 1e3 * last_s,
        "queue_ms": 0.0, "error": ""}))


def test_a_mixed_steps_excess_is_what_its_prompt_tokens_add_to_the_decode_only_step_of_its_batch():
    # Decode-only steps of 5 ms at batch 4; mixed steps at batch 4 of 5 ms + 0.01 ms per prompt token.
    prefill = [0, 0, 0, 100, 0, 300, 0, 500]
    it = _steps([4] * 8, prefill, [5.0 + 0.01 * p for p in prefill])
    steps, checks = se.excess(it)
    assert steps["prompt_ms"].tolist() == pytest.approx([0, 0, 0, 1.0, 0, 3.0, 0, 5.0])
    c = checks.iloc[0]
    assert (c["mixed_steps"], c["unpriced_steps"], c["median_excess_ms"], bool(c["ok"])) == (3, 0, pytest.approx(3.0), True)
    # A request whose first token came with the first step (5 ms) and its last with the eighth rode the last seven.
    parts = gs.model_free_parts(_request(0.005, float(steps["t_s"].iloc[-1])), it)[0].iloc[0]
    assert parts["prefill_stalls"] == pytest.approx(9.0)  # 1 + 3 + 5 ms
    assert parts["decode_steps"] == pytest.approx(7 * 5.0) and parts["unpriced"] == 0.0


def test_a_batch_size_without_decode_only_steps_is_interpolated_between_its_neighbours_never_extrapolated():
    # Decode-only: batch 2 at 4 ms, batch 6 at 6 ms (3 each). Mixed: batch 4 (baseline 5 ms), batch 9 (past 6).
    it = _steps([2, 2, 2, 6, 6, 6, 4, 9], [0] * 6 + [50, 50], [4, 4, 4, 6, 6, 6, 5.5, 8.0])
    steps, checks = se.excess(it)
    assert steps["prompt_ms"].iloc[6] == pytest.approx(0.5) and np.isnan(steps["prompt_ms"].iloc[7])
    c = checks.iloc[0]
    assert (c["unpriced_steps"], c["unpriced_share"]) == (1, pytest.approx(8.0 / 13.5))
    parts = gs.model_free_parts(_request(0.0, float(steps["t_s"].iloc[-1])), it)[0].iloc[0]
    assert (parts["prefill_stalls"], parts["unpriced"]) == (pytest.approx(0.5), pytest.approx(8.0))


def test_a_size_with_too_few_decode_only_steps_gives_no_baseline_of_its_own():
    # Batch 4 has one decode-only step of 9 ms (fewer than MIN_STEPS): the baseline comes from 3 and 5.
    it = _steps([3, 3, 3, 5, 5, 5, 4, 4], [0] * 7 + [10], [4, 4, 4, 6, 6, 6, 9, 5.5])
    assert se.excess(it)[0]["prompt_ms"].iloc[7] == pytest.approx(0.5)


def test_mixed_steps_shorter_than_decode_only_ones_break_the_invariant_and_are_left_unpriced():
    it = _steps([4] * 6, [0, 0, 0, 200, 200, 200], [5, 5, 5, 3, 3, 3])
    steps, checks = se.excess(it)
    c = checks.iloc[0]
    assert (bool(c["ok"]), c["median_excess_ms"], c["unpriced_steps"]) == (False, pytest.approx(-2.0), 3)
    assert steps["prompt_ms"].iloc[3:].isna().all()
    parts = gs.model_free_parts(_request(0.0, float(steps["t_s"].iloc[-1])), it)[0].iloc[0]
    assert (parts["prefill_stalls"], parts["unpriced"]) == (0.0, pytest.approx(9.0))
