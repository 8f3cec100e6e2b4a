"""metrics.step_checks on synthetic step series: correct timing passes both invariants; a series
whose records move a prefill's time onto the record before it (as the committed in-process h200-tp1
shows) fails both."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from prefixstudy.metrics import step_checks
from prefixstudy.costmodel import engine_fit
from prefixstudy.schema import typed_iterations

A, B, E, C = 5.0, 0.02, 3.0, 0.07  # ms a step, per prefill token, per prefill request, per decode token


def series(n=2000, seed=0, shift=False, mode="on", noise_ms=0.3) -> pd.DataFrame:
    """Steps of one point: a decode batch of 8-15 requests that changes every 50 steps, one prefill
    of 62 or 1214 tokens in a quarter of the steps, at random.  ``shift``: the records misattribute
    time between neighbours as the committed in-process h200-tp1 does (prefill records 4.4 ms at
    the median against 5.7 ms decode-only, the decode-only record before a prefill long): a prefill
    step's record keeps 3/4 of a decode step and the rest of its time lands on the record before."""
    rng = np.random.default_rng(seed)
    dec = np.repeat(rng.integers(8, 16, n // 50 + 1), 50)[:n]
    nreq = (rng.random(n) < 0.25).astype(int)
    pt = nreq * rng.choice([62, 1214], n)
    ms = A + B * pt + E * nreq + C * dec + rng.normal(0, noise_ms, n)
    if shift:
        for i in np.flatnonzero(nreq)[::-1]:
            if i > 0:
                kept = 0.75 * (A + C * dec[i])
                ms[i - 1] += ms[i] - kept
                ms[i] = kept
    t = np.cumsum(ms) / 1e3
    return typed_iterations(pd.DataFrame({
        "mode": mode, "rate": 16.0, "repeat": 0, "timing": "engine", "step_start_s": t - ms / 1e3, "t_s": t,
        "step_ms": ms, "prefill_tokens": pt, "num_prefill_reqs": nreq, "decode_tokens": dec,
        "context_tokens": dec * 1300 + pt, "cached_tokens": 0, "num_running": dec, "num_waiting": 0}))


def check(it):
    fit = engine_fit.fit_step_cost(it, n_boot=0)
    return fit, step_checks.check_steps(it, fit.coef)


def test_correct_timing_passes_both_checks():
    fit, c = check(pd.concat([series(), series(seed=1, mode="off")], ignore_index=True))
    assert fit.coef[:4] == pytest.approx([A, B, E, C], rel=0.1)
    a = c["prefill_not_faster"]["on"]
    assert a["ok"] and a["faster_share"] == 0.0 and a["n"] == 507  # a quarter of 2000 steps, at random
    assert a["bound"] == pytest.approx(0.5 + 3 * 0.5 / np.sqrt(507))
    w = c["window_agreement"]
    assert w["ok"] and w["n_windows"] == 2 * (2000 // 32)
    assert max(m["max_diff"] for m in w["modes"].values()) < 0.01 and c["ok"]


def test_time_moved_from_prefill_records_to_their_neighbours_fails_both_checks():
    fit, c = check(series(shift=True))
    a = c["prefill_not_faster"]["on"]
    # every prefill record is 3/4 of a decode step of its batch: all but the rare noise outlier are faster than its median
    assert not a["ok"] and a["faster_share"] > 0.99
    w = c["window_agreement"]["modes"]["on"]
    # the window sums still see every prefill: the per-step fit moved its cost into the decode term
    assert not w["ok"] and w["prefill_diff"] > 0.05
    assert c["ok"] is False


def test_a_share_just_at_one_half_is_noise_not_a_violation():
    busy = pd.DataFrame({"mode": "on", "rate": 1.0, "repeat": 0, "decode_tokens": 4,
                         "prefill_tokens": [0] * 5 + [10] * 4, "step_ms": [1, 2, 3, 4, 5, 2.5, 2.9, 3.5, 3.1]})
    r = step_checks.prefill_not_faster(busy)["on"]
    # decode-only median 3; prefill steps 2.5 and 2.9 faster: 2 of 4 = 0.5 <= 0.5 + 3 * 0.5 / 2
    assert (r["n"], r["faster_share"], r["bound"], r["ok"]) == (4, 0.5, 1.25, True)


def test_too_few_steps_for_windows_is_not_judged():
    it = series(n=100)
    busy = engine_fit.busy_steps(it)
    w = step_checks.window_agreement(busy, np.array([A, B, E, C, 0.0]))
    assert w["n_windows"] == 3 and w["ok"] is None
    assert step_checks.check_steps(it.iloc[:0], None) is None
