"""metrics.gain_split on a hand-made point and on the committed h200-tp1: the parts of each
request add up to its E2E, the parts' points add up to the gain, both measures of the stalls, and
their intervals over the repeats."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from prefixstudy.metrics import gain_split as gs
from prefixstudy.shared.bootstrap import t_quantile
from prefixstudy.costmodel.engine_fit import COEF_NAMES
from prefixstudy.results import load
from prefixstudy.schema import typed_iterations, typed_requests

COEF = np.array([4.0, 0.02, 1.0, 0.05, 0.0])  # a, b, e, c, k


def _point(mode: str, prefill_tokens: int, repeat: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One request sent at 0 s: queued 1 ms, first token at 30 ms, then 4 decode steps of 5 ms ending at
    35, 40, 45 and 50 ms; the second of them carries another request's prompt chunk (its fitted prompt
    work 0.02 x tokens + 1 ms lengthens that step)."""
    stall = 0.02 * prefill_tokens + 1.0 if prefill_tokens else 0.0
    ends = np.array([0.035, 0.040 + stall / 1e3, 0.045 + stall / 1e3, 0.050 + stall / 1e3])
    ms = np.array([5.0, 5.0 + stall, 5.0, 5.0])
    it = typed_iterations(pd.DataFrame({
        "mode": mode, "rate": 1.0, "repeat": repeat, "timing": "gpu-span", "step_start_s": ends - ms / 1e3, "t_s": ends,
        "step_ms": ms, "prefill_tokens": [0, prefill_tokens, 0, 0], "num_prefill_reqs": [0, int(prefill_tokens > 0), 0, 0],
        "decode_tokens": 1, "cached_tokens": 0}))
    e2e = 1e3 * ends[-1] + 0.5  # the last token reaches the client 0.5 ms after its step
    req = typed_requests(pd.DataFrame({
        "mode": [mode], "rate": 1.0, "repeat": repeat, "request_index": 0, "request_id": f"{mode}-0", "warmup": False,
        "prompt_tokens": 1214, "output_tokens": 5, "sent_s": 0.0, "ttft_ms": 30.0, "e2e_ms": e2e, "queue_ms": 1.0,
        "error": ""}))
    return req, it


def test_a_requests_parts_add_up_to_its_e2e_and_price_a_co_batched_prompt_chunk():
    on, off = _point("on", 0), _point("off", 1200)
    parts = gs.request_parts(pd.concat([on[0], off[0]]), pd.concat([on[1], off[1]]), COEF)
    p = parts.set_index("mode")
    assert p.loc["off", "prefill_stalls"] == pytest.approx(25.0)  # 0.02 x 1200 + 1 ms
    assert p.loc["on", "prefill_stalls"] == 0.0
    assert p.loc["off", "decode_steps"] == pytest.approx(20.0) and p.loc["on", "decode_steps"] == pytest.approx(20.0)
    assert (p.loc[:, "queue"].tolist(), p.loc[:, "own_prefill"].tolist()) == ([1.0, 1.0], [29.0, 29.0])
    assert p.loc[:, "residual"].round(9).tolist() == [0.5, 0.5]
    assert (p[list(gs.PARTS)].sum(axis=1) - p["e2e_ms"]).abs().max() < 1e-9
    assert p.loc[:, "unpriced"].tolist() == [0.0, 0.0]
    split = gs.gain_split(parts).iloc[0]
    assert split["prefill_stalls_points"] == pytest.approx(25.0 / 75.5)
    assert sum(split[f"{x}_points"] for x in gs.PARTS) == pytest.approx(split["gain"])
    # Three decode-only steps of 5 ms at batch 1 give the model-free baseline: the excess is the same 25 ms.
    both, checks = gs.both(pd.concat([on[0], off[0]]), pd.concat([on[1], off[1]]), COEF)
    assert both["measure"].tolist() == ["fitted", "model-free"] and checks["ok"].all()
    assert both["prefill_stalls_points"].tolist() == pytest.approx([25.0 / 75.5] * 2)


def test_each_parts_interval_is_students_t_over_the_repeats_own_splits():
    # OFF's co-batched chunk is 1200 prompt tokens (25 ms) in repeat 0, 700 (15 ms) in repeat 1; ON has none.
    pts = [_point("on", 0, 0), _point("off", 1200, 0), _point("on", 0, 1), _point("off", 700, 1)]
    req, it = (pd.concat([p[k] for p in pts]) for k in (0, 1))
    s = gs.both(req, it, COEF)[0].set_index("measure")
    per_repeat = np.array([25.0 / 75.5, 15.0 / 65.5])
    half = t_quantile(0.975, 1) * per_repeat.std(ddof=1) / np.sqrt(2)
    for m in gs.MEASURES:
        r = s.loc[m]
        assert r["prefill_stalls_points"] == pytest.approx(20.0 / 70.5)  # pooled: (70.5 - 50.5) / 70.5
        assert (r["prefill_stalls_points_lo"], r["prefill_stalls_points_hi"]) == pytest.approx(
            (20.0 / 70.5 - half, 20.0 / 70.5 + half))
        assert (r["gain_lo"], r["gain_hi"]) == pytest.approx((20.0 / 70.5 - half, 20.0 / 70.5 + half))
        assert r["decode_steps_points_lo"] == pytest.approx(0.0) and r["decode_steps_points_hi"] == pytest.approx(0.0)


def test_the_committed_headline_studys_gain_is_mostly_other_requests_prefills_at_16_req_s():
    st = load(Path(__file__).resolve().parents[3] / "experiments/results/h200-tp1")
    coef = [st.manifest["step_fit"][k] for k in COEF_NAMES]
    parts = gs.request_parts(st.requests, st.iterations, coef)
    assert len(parts) == len(parts.dropna()) and (parts[list(gs.PARTS)].sum(axis=1) - parts["e2e_ms"]).abs().max() < 1e-6
    s = gs.gain_split(parts).set_index("rate")
    at16 = (100 * s.loc[16.0, ["gain", *(f"{x}_points" for x in gs.PARTS)]]).round(1).tolist()
    assert at16 == [42.4, 0.0, 2.8, 39.5, 0.3, 0.0, -0.3]  # gain; queue, own prefill, stalls, decode, unpriced, residual


def test_the_model_free_measure_moves_points_from_stalls_to_decode_steps_on_the_committed_study():
    """At 16 req/s the fit prices OFF's mixed steps from its long saturated ones: the model-free
    excess gives other requests' prompt chunks fewer points and the decode steps more, each
    outside the other measure's interval."""
    st = load(Path(__file__).resolve().parents[3] / "experiments/results/h200-tp1")
    s, checks = gs.both(st.requests, st.iterations, [st.manifest["step_fit"][k] for k in COEF_NAMES])
    assert checks["ok"].all()
    at16 = s[s["rate"] == 16.0].set_index("measure")
    cols = [f"{p}_points{x}" for p in ("prefill_stalls", "decode_steps", "unpriced") for x in ("", "_lo", "_hi")]
    assert (100 * at16.loc["model-free", cols]).round(1).tolist() == [33.0, 30.8, 35.1, 6.7, 5.8, 7.6, 0.2, -0.5, 0.9]
    fit = at16.loc["fitted"]
    assert not fit["prefill_stalls_points_lo"] <= at16.loc["model-free", "prefill_stalls_points"] <= fit[
        "prefill_stalls_points_hi"]
