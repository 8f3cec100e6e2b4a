"""The decode lane (``sim.lane``) against the step-by-step path (``--stepwise``): the same point,
simulated both ways on the shipped configs and the committed h200-tp1 calibration, gives the
same requests and the same steps, bit for bit.  The points cover a sweep where most steps are in
the lane, a saturated one (a queue, max_num_seqs running), LRU eviction of prefixes under cache
pressure, preemption in a small KV cache and multi-turn sessions (turns released by their
parent's last token)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest

from prefixstudy.config import load_config
from prefixstudy.configs import resolve_config
from prefixstudy.sim.run import make_target
from prefixstudy.sim.study import RowFacts, SimSession, scheduler_spec
from prefixstudy.workloads import load_rows

REPO = Path(__file__).resolve().parents[3]
CALIBRATION = REPO / "experiments/results/h200-tp1-sync"
SHORT = {"sweep.min_duration_s": 6, "sweep.num_requests": 40}


def both_ways(config: str, overrides: dict, gpu: str | None, tp: int | None, mode: str, rate: float):
    """(fast PointResult, stepwise PointResult, the fast one's lane)."""
    from prefixstudy.sim.vllm_setup import vllm_config

    cfg = load_config(resolve_config(config), overrides)
    rows = load_rows(cfg)
    target = make_target(cfg, CALIBRATION, gpu, tp, rows)
    vc, facts = vllm_config(scheduler_spec(cfg, target, mode)), RowFacts.of(rows)
    out = []
    for stepwise in (False, True):
        session = SimSession(cfg, mode, rows, replace(target, stepwise=stepwise), vc, facts)
        out.append(session.run_point(rate, 0))
        if not stepwise:
            lane = session.sim.lane
    return out[0], out[1], lane


def assert_identical(fast, stepwise) -> None:
    wall = ["started_at"]  # host wall-clock stamps: the only columns that may differ
    fr, sr = fast.requests.drop(columns=wall, errors="ignore"), stepwise.requests.drop(columns=wall, errors="ignore")
    pd.testing.assert_frame_equal(fr, sr, check_exact=True)
    pd.testing.assert_frame_equal(fast.iterations, stepwise.iterations, check_exact=True)
    assert {k: v for k, v in fast.meta.items() if k not in ("sim_wall_s", "started_at")} == \
        {k: v for k, v in stepwise.meta.items() if k not in ("sim_wall_s", "started_at")}


@pytest.mark.slow  # each point twice, once without the lane
def test_the_seed_sweep_mostly_in_the_lane_is_step_for_step_the_same():
    """ON at 16 req/s on 8 x A100: 96 requests of 143 tokens, most steps pure decode."""
    fast, step, lane = both_ways("seed-a100x8-tp8", SHORT, "A100-SXM4-40GB", 8, "on", 16)
    assert_identical(fast, step)
    assert len(step.iterations) == fast.meta["sim_steps"] and lane.steps > len(step.iterations) // 2
    assert lane.stretch_steps > 0 and lane.steps - lane.stretch_steps > 0  # both kinds of held step
    assert list(step.requests.error[~step.requests.warmup]) == [""] * 96


@pytest.mark.slow  # each point twice, once without the lane
def test_a_saturated_point_is_the_same():
    """OFF at 64 req/s: the queue grows, 256 requests run, the lane only between finishes."""
    fast, step, lane = both_ways("seed-a100x8-tp8", SHORT, "A100-SXM4-40GB", 8, "off", 64)
    assert_identical(fast, step)
    it = step.iterations
    assert it.num_running.max() == 256 and it.num_waiting.max() > 100
    assert lane.steps - lane.stretch_steps > len(it) // 2  # most steps admit a prompt beside the held


@pytest.mark.slow  # each point twice, once without the lane
def test_lru_eviction_under_cache_pressure_is_the_same():
    """40 groups of 112-block prefixes in 4400 blocks at 24 req/s: prefixes are evicted, so the
    hit rate falls below the bound; which blocks go depends on every allocation's order."""
    over = {"engine.extra_args.num_gpu_blocks_override": 4400}
    fast, step, lane = both_ways("h200-cache-pressure", over, None, None, "on", 24)
    assert_identical(fast, step)
    m = step.requests[~step.requests.warmup]
    assert 0 < m.num_cached_tokens.sum() < m.expected_cached_tokens.sum() and lane.steps > 0


@pytest.mark.slow  # each point twice, once without the lane
def test_preemption_in_a_small_cache_is_the_same():
    """OFF at 64 req/s in 1200 blocks (14 requests' worth): running requests are preempted and
    recompute their prompts, so more prompt tokens are computed than were sent."""
    over = {**SHORT, "engine.extra_args": {"num_gpu_blocks_override": 1200}}
    fast, step, lane = both_ways("seed-a100x8-tp8", over, "A100-SXM4-40GB", 8, "off", 64)
    assert_identical(fast, step)
    m = step.requests[~step.requests.warmup]
    assert step.iterations.prefill_tokens.sum() > m.prompt_tokens[m.ttft_ms.notna()].sum()
    assert lane.steps > 0 and lane.returns > 0  # short of blocks: every held request went back


@pytest.mark.slow  # each point twice, once without the lane
def test_a_token_budget_shorter_than_a_prompt_is_the_same():
    """A 512-token budget and 1214-token prompts at 32 req/s: prompts are computed in chunks, and
    where a chunk would take the budget that a held request ahead of it in ``running`` needs, every
    held request goes back for that step."""
    over = {**SHORT, "engine.max_num_batched_tokens": 512}
    fast, step, lane = both_ways("seed-a100x8-tp8", over, "A100-SXM4-40GB", 8, "off", 32)
    assert_identical(fast, step)
    it = step.iterations
    assert it.prefill_tokens.max() <= 512 and (it.prefill_tokens % 1214 != 0).any()
    assert lane.steps > 0 and lane.returns > 0


@pytest.mark.slow  # each point twice, once without the lane
def test_multi_turn_sessions_are_the_same():
    """Later turns arrive think time after their parent's last token, which the lane produces."""
    fast, step, lane = both_ways("h200-multiturn", {}, None, None, "on", 6)
    assert_identical(fast, step)
    assert (step.requests.parent_index >= 0).sum() == 90 and lane.steps > 0


def test_the_lane_stops_before_an_allocation_that_would_preempt(make_sim):
    """Two requests decode in 9 usable blocks, nothing waits: each needs 5 blocks by its last
    token, so the step that would take a 10th preempts the younger one.  The lane must hand that
    step to vLLM; both ways the same tokens at the same times, and the same steps."""
    from prefixstudy.sim.driver import SimRequest

    reqs = [SimRequest("a", list(range(1, 33)), 40, 0.0), SimRequest("b", list(range(101, 133)), 40, 0.0)]
    out = []
    for stepwise in (False, True):
        sim = make_sim("off", num_gpu_blocks=10)
        if stepwise:
            sim.lane = None
        traces = sim.run(reqs)
        out.append((traces, sim.steps, sim.lane))
    (fast, fast_steps, lane), (step, step_steps, _) = out
    assert fast == step and fast_steps == step_steps and lane.steps > 0
    # b was preempted: it computed its prompt (and its tokens so far) twice
    assert sum(s["prefill_tokens"] for s in step_steps) > 64
    assert [len(t.token_times) for t in step.values()] == [40, 40]
