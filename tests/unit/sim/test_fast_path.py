"""The decode lane (``sim.lane``) against the step-by-step path (``--stepwise``): the same point,
simulated both ways on the shipped configs, gives the same requests and the same steps, bit for
bit, on both committed h200-tp1 calibrations: one engine step at a time (``h200-tp1-sync``) and
vLLM's default engine (``h200-tp1``: async scheduling, so vLLM's AsyncScheduler, whose decoders
carry an output placeholder and cache a filled block one step late).  The points cover a sweep where
most steps are in the lane, a saturated one (a queue, max_num_seqs running), LRU eviction of
prefixes under cache pressure, preemption in a small KV cache and multi-turn sessions (turns
released by their parent's last token)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest

from prefixstudy.config import load_config
from prefixstudy.configs import resolve_config
from prefixstudy.study.simulate import make_target
from prefixstudy.sim.sessions import RowFacts, SimSession, scheduler_spec
from prefixstudy.workloads import load_rows

REPO = Path(__file__).resolve().parents[3]
# one engine step at a time, and vLLM's default engine (async scheduling)
CALIBRATIONS = {"sync": REPO / "experiments/results/h200-tp1-sync", "async": REPO / "experiments/results/h200-tp1"}
SHORT = {"sweep.min_duration_s": 6, "sweep.num_requests": 40}


def both_ways(config: str, overrides: dict, gpu: str | None, tp: int | None, mode: str, rate: float,
              engine: str = "sync"):
    """(fast PointResult, stepwise PointResult, the fast one's lane), calibrated on ``engine``'s
    h200-tp1 study."""
    from prefixstudy.sim.vllm_setup import vllm_config

    cfg = load_config(resolve_config(config), overrides)
    rows = load_rows(cfg)
    target = make_target(cfg, CALIBRATIONS[engine], gpu, tp, rows)
    vc, facts = vllm_config(scheduler_spec(cfg, target, mode)), RowFacts.of(rows)
    out = []
    for stepwise in (False, True):
        session = SimSession(cfg, mode, rows, replace(target, stepwise=stepwise), vc, facts)
        out.append(session.run_point(rate, 0))
        if not stepwise:
            lane = session.sim.lane
    assert lane.pipelined == (engine == "async") == session.sim.pipelined
    return out[0], out[1], lane


def assert_identical(fast, stepwise) -> None:
    wall = ["started_at"]  # host wall-clock stamps: the only columns that may differ
    fr, sr = fast.requests.drop(columns=wall, errors="ignore"), stepwise.requests.drop(columns=wall, errors="ignore")
    pd.testing.assert_frame_equal(fr, sr, check_exact=True)
    pd.testing.assert_frame_equal(fast.iterations, stepwise.iterations, check_exact=True)
    assert {k: v for k, v in fast.meta.items() if k not in ("sim_wall_s", "started_at")} == \
        {k: v for k, v in stepwise.meta.items() if k not in ("sim_wall_s", "started_at")}


@pytest.mark.slow  # each point twice, once without the lane
@pytest.mark.parametrize("engine", ["sync", "async"])
def test_the_seed_sweep_mostly_in_the_lane_is_step_for_step_the_same(engine):
    """ON at 16 req/s on 8 x A100: 96 requests of 143 tokens, most steps pure decode."""
    fast, step, lane = both_ways("seed-a100x8-tp8", SHORT, "A100-SXM4-40GB", 8, "on", 16, engine)
    assert_identical(fast, step)
    assert len(step.iterations) == fast.meta["sim_steps"] and lane.steps > len(step.iterations) // 2
    assert lane.stretch_steps > 0 and lane.steps - lane.stretch_steps > 0  # both kinds of held step
    assert list(step.requests.error[~step.requests.warmup]) == [""] * 96


@pytest.mark.slow  # each point twice, once without the lane
@pytest.mark.parametrize("engine", ["sync", "async"])
def test_a_saturated_point_is_the_same(engine):
    """OFF at 64 req/s: the queue grows, 256 requests run, the lane only between finishes."""
    fast, step, lane = both_ways("seed-a100x8-tp8", SHORT, "A100-SXM4-40GB", 8, "off", 64, engine)
    assert_identical(fast, step)
    it = step.iterations
    assert it.num_running.max() == 256 and it.num_waiting.max() > 100
    assert lane.steps - lane.stretch_steps > len(it) // 2  # most steps admit a prompt beside the held


@pytest.mark.slow  # each point twice, once without the lane
@pytest.mark.parametrize("engine", ["sync", "async"])
def test_lru_eviction_under_cache_pressure_is_the_same(engine):
    """40 groups of 112-block prefixes in 4400 blocks at 24 req/s: prefixes are evicted, so the
    hit rate falls below the bound; which blocks go depends on every allocation's order."""
    over = {"engine.extra_args.num_gpu_blocks_override": 4400}
    fast, step, lane = both_ways("h200-cache-pressure", over, None, None, "on", 24, engine)
    assert_identical(fast, step)
    m = step.requests[~step.requests.warmup]
    assert 0 < m.num_cached_tokens.sum() < m.expected_cached_tokens.sum() and lane.steps > 0


@pytest.mark.slow  # each point twice, once without the lane
@pytest.mark.parametrize("engine", ["sync", "async"])
def test_preemption_in_a_small_cache_is_the_same(engine):
    """OFF at 64 req/s in 1200 blocks (14 requests' worth): running requests are preempted and
    recompute their prompts, so more prompt tokens are computed than were sent."""
    over = {**SHORT, "engine.extra_args": {"num_gpu_blocks_override": 1200}}
    fast, step, lane = both_ways("seed-a100x8-tp8", over, "A100-SXM4-40GB", 8, "off", 64, engine)
    assert_identical(fast, step)
    m = step.requests[~step.requests.warmup]
    assert step.iterations.prefill_tokens.sum() > m.prompt_tokens[m.ttft_ms.notna()].sum()
    assert lane.steps > 0 and lane.returns > 0  # short of blocks: every held request went back


@pytest.mark.slow  # each point twice, once without the lane
@pytest.mark.parametrize("engine", ["sync", "async"])
def test_a_token_budget_shorter_than_a_prompt_is_the_same(engine):
    """A 512-token budget and 1214-token prompts at 32 req/s: prompts are computed in chunks, and
    where a chunk would take the budget that a held request ahead of it in ``running`` needs, every
    held request goes back for that step."""
    over = {**SHORT, "engine.max_num_batched_tokens": 512}
    fast, step, lane = both_ways("seed-a100x8-tp8", over, "A100-SXM4-40GB", 8, "off", 32, engine)
    assert_identical(fast, step)
    it = step.iterations
    assert it.prefill_tokens.max() <= 512 and (it.prefill_tokens % 1214 != 0).any()
    assert lane.steps > 0 and lane.returns > 0


@pytest.mark.slow  # each point twice, once without the lane
@pytest.mark.parametrize("engine", ["sync", "async"])
def test_multi_turn_sessions_are_the_same(engine):
    """Later turns arrive think time after their parent's last token, which the lane produces."""
    fast, step, lane = both_ways("h200-multiturn", {}, None, None, "on", 6, engine)
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


def _both_ways_by_arrival(make_sim, async_scheduling: bool, requests_at, times: list[float]) -> tuple[list, list]:
    """For each t of ``times``, ``requests_at(t)`` simulated on fresh simulators: (the lane's traces
    and held steps, the stepwise traces)."""
    fast, step = [], []
    for t in times:
        for stepwise, out in ((False, fast), (True, step)):
            sim = make_sim("on", async_scheduling=async_scheduling)
            if stepwise:
                sim.lane = None
            assert sim.pipelined == async_scheduling
            traces = sim.run(requests_at(t))
            out.append((traces, sim.lane.steps if sim.lane else None))
    return fast, step


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_a_prompt_that_repeats_a_decoders_tokens_finds_the_blocks_it_filled_at_the_same_step(
        make_sim, async_scheduling):
    """b's prompt is a's prompt and then a's sampled tokens: what b finds cached is the blocks a's
    decode has filled by the step that admits b, which the lane caches itself while it holds a
    (async scheduling: one step late, at the step that opens the next block).  A cache one step
    early or late changes b's hits at some of its 40 arrival times."""
    from prefixstudy.sim.driver import SimRequest
    from prefixstudy.costmodel.step import SAMPLED_TOKEN_ID

    def requests_at(t):
        return [SimRequest("a", list(range(1, 33)), 80, 0.0),
                SimRequest("b", list(range(1, 33)) + [SAMPLED_TOKEN_ID] * 64 + [999] * 4, 2, t)]

    times = [0.004 + 0.0011 * k for k in range(40)]
    fast, step = _both_ways_by_arrival(make_sim, async_scheduling, requests_at, times)
    assert [f[0] for f in fast] == [s[0] for s in step]
    assert all(held == 78 for _, held in fast)  # a is held from its first decode to its last step
    assert [f[0]["b"].num_cached_tokens for f in fast] == [32] * 12 + [48] * 16 + [64] * 12


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_requests_that_finish_in_one_step_free_their_blocks_in_running_order(make_sim, async_scheduling):
    """a (held until its last step) and b (two tokens, never held) finish in one step at some of
    b's arrival times; vLLM frees them in running's order, a's blocks first, so a's prompt blocks
    are nearer the head of the free queue, where c's long prompt evicts, and d (a's prompt again)
    finds 16 of its 32 tokens instead of 32.  Async, the lane gives a back into the step in flight,
    which must keep running's order."""
    from prefixstudy.sim.driver import SimRequest

    def requests_at(t):
        return [SimRequest("a", list(range(1, 33)), 40, 0.0), SimRequest("b", list(range(1000, 1048)), 2, t),
                SimRequest("c", list(range(2000, 2943)), 1, 0.2), SimRequest("d", list(range(1, 35)), 1, 0.4)]

    times = [0.030 + 0.0003 * k for k in range(50)]
    fast, step = _both_ways_by_arrival(make_sim, async_scheduling, requests_at, times)
    assert [f[0] for f in fast] == [s[0] for s in step]
    assert all(held > 0 for _, held in fast)
    together = [f[0]["a"].token_times[-1] == f[0]["b"].token_times[-1] for f in fast]
    hits = [f[0]["d"].num_cached_tokens for f in fast]
    first = 37 if not async_scheduling else 33  # async: b's tokens come a step later
    assert together == [False] * first + [True] * 4 + [False] * (46 - first)
    assert hits == [32] * first + [16] * (50 - first)


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_a_step_s_kv_tokens_count_a_shared_prefix_block_once_and_the_lane_prices_what_vllm_holds(
        make_sim, async_scheduling):
    """``kv_tokens`` is the blocks in use times 16.  b arrives while a decodes and shares a's two whole
    prefix blocks: at the step that computes b's prompt, a holds 4 blocks (49 to 64 tokens) and b 4
    (50 tokens), 2 of them a's with caching ON: 6 blocks, 96 tokens, against 8 blocks, 128 tokens,
    with caching OFF.  The lane prices every step with the kv_tokens the stepwise path gives."""
    from prefixstudy.sim.driver import SimRequest
    from tests.unit.sim.conftest import unit_cost_ms

    prefix = list(range(1000, 1040))  # 40 tokens: two whole 16-token blocks and 8 over
    reqs = [SimRequest("a", prefix + list(range(1, 9)), 40, 0.0), SimRequest("b", prefix + list(range(2000, 2010)), 40, 0.005)]
    for mode, uncached, blocks in (("on", 18, 6), ("off", 50, 8)):
        priced = []
        for stepwise in (False, True):
            seen: list = []
            sim = make_sim(mode, cost_ms=lambda f, seen=seen: seen.append(f) or unit_cost_ms(f),
                           async_scheduling=async_scheduling)
            if stepwise:
                sim.lane = None
            else:
                lane = sim.lane
            sim.run(reqs)
            priced.append([(f.prefill_tokens, f.decode_tokens, f.kv_tokens) for f in seen])
        assert priced[0] == priced[1] and lane.steps > 0
        (at_b,) = [kv for p, d, kv in priced[0] if p == uncached]
        assert at_b == 16 * blocks
        assert priced[0][0] == (48, 0, 48)  # a's prompt alone: 3 blocks
