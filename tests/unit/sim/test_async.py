"""vLLM's default engine (async scheduling) in virtual time: the two-part step price, the fit of
both parts, which calibrations get it, and the pipelined schedule, on numbers worked out by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from prefixstudy.errors import UserError
from prefixstudy.costmodel.step_cost import CostModel, async_recorded, busy_steps, fit, fit_linear, host_windows
from prefixstudy.sim.driver import SimRequest
from prefixstudy.costmodel.step import StepFeatures

from tests.scripts import load_script
from tests.unit.sim.conftest import unit_cost_ms

REPO = Path(__file__).resolve().parents[3]
DECODE = StepFeatures(prefill_tokens=0, decode_tokens=1, context_tokens=100, num_reqs=1)


def test_a_step_costs_the_slower_of_the_gpu_and_the_host():
    assert CostModel(5.0, {}, host={"c0_ms": 3.0, "coef_ms": {}})(DECODE) == 5.0  # GPU-bound
    assert CostModel(5.0, {}, host={"c0_ms": 7.0, "coef_ms": {}})(DECODE) == 7.0  # host-bound
    assert CostModel(5.0, {})(DECODE) == 5.0  # one step at a time: no host part, the fit alone
    both = CostModel(1.0, {"decode_tokens": 0.1}, host={"c0_ms": 1.0, "coef_ms": {"decode_tokens": 0.05}})
    assert both(DECODE) == pytest.approx(1.1) and both.pipelined and not CostModel(5.0, {}).pipelined


def gpu_span_steps():
    """Four windows of 16 steps, each a 1000-token prompt beside ``base`` decoders, then decode-only
    steps of base .. base + 14 decoders.  GPU span 2 + 0.01 prefill + 0.05 decode; the host's own
    work 3 + 0.02 decode, so the decode-only steps (under 34 decoders) are the host's.  A step takes
    the slower of the two, and its host record is shifted as vLLM's are: the prompt step's record
    ends 4 ms before its GPU work does, and the next record carries the wait."""
    rows = []
    for base in (1, 6, 11, 16):
        rows += [(1000, 1, base)] + [(0, 0, base + j) for j in range(15)]
    df = pd.DataFrame(rows, columns=["prefill_tokens", "num_prefill_reqs", "decode_tokens"])
    df["context_tokens"] = 0
    df["step_ms"] = 2 + 0.01 * df.prefill_tokens + 0.05 * df.decode_tokens
    wall = df.step_ms.clip(lower=3 + 0.02 * df.decode_tokens)
    shift = 4.0 * (df.prefill_tokens > 0)
    df["host_step_ms"] = wall - shift + shift.shift(1, fill_value=0.0)
    df["t_s"] = wall.cumsum() / 1000
    df["mode"], df["rate"], df["repeat"], df["timing"] = "on", 1.0, 0, "gpu-span"
    return df


def test_the_linear_async_fit_prices_the_gpu_on_the_spans_and_a_host_floor_on_the_windows_of_host_stamps():
    m = fit_linear(gpu_span_steps(), async_scheduling=True)
    assert m.c0_ms == pytest.approx(2.0) and m.coef_ms == pytest.approx({"prefill_tokens": 0.01, "decode_tokens": 0.05})
    assert m.host["c0_ms"] == pytest.approx(3.0, abs=1e-3)
    assert m.host["coef_ms"] == pytest.approx({"decode_tokens": 0.02}, abs=1e-4)
    assert (m.host["n_steps"], m.host["n_windows"], m.host["binding_steps"], m.timing) == (64, 4, 60, "gpu-span")
    # a 1000-token prefill is the GPU's (12 ms against 3), eight decodes the host's (3.16 against 2.4)
    assert m(StepFeatures(1000, 0, 0, 1, num_prefill_reqs=1)) == pytest.approx(12.0)
    assert m(StepFeatures(0, 8, 0, 8)) == pytest.approx(3.16, abs=1e-3)
    assert fit(gpu_span_steps()).host == {}  # the same steps, fitted as one step at a time


def launched_steps():
    """Eight windows of 16 steps, each an ON prompt (200 tokens computed, 500 to 4000 the host hashes)
    beside ``base`` decoders, then decode-only steps of base .. base + 14 decoders; GPU span 2 + 0.01
    prefill + 0.05 decode.  Run as vLLM's async loop runs them: the host launches step K while K-1
    runs, in 3 ms + 0.02 ms a decoder + 0.004 ms a hashed token, and K starts once K-1 has ended and
    K is launched.  Each host record runs from the previous step's output to this one's."""
    rows = []
    for i, base in enumerate((1, 6, 11, 16, 3, 8, 13, 18)):
        rows += [(200, 1, base, 500 * (i + 1))] + [(0, 0, base + j, 0) for j in range(15)]
    df = pd.DataFrame(rows, columns=["prefill_tokens", "num_prefill_reqs", "decode_tokens", "prefix_queries"])
    df["context_tokens"] = 0
    df["step_ms"] = 2 + 0.01 * df.prefill_tokens + 0.05 * df.decode_tokens
    host = 3 + 0.02 * df.decode_tokens + 0.004 * df.prefix_queries
    start = end = 0.0
    ends = []
    for gpu_ms, host_ms in zip(df.step_ms, host, strict=True):
        start = max(end, start + host_ms)
        end = start + gpu_ms
        ends.append(end)
    df["t_s"] = pd.Series(ends) / 1000
    df["host_step_ms"] = pd.Series(ends).diff().fillna(ends[0])
    df["mode"], df["rate"], df["repeat"], df["timing"] = "on", 1.0, 0, "gpu-span"
    return df


def test_the_launch_fit_recovers_the_host_s_work_and_the_floor_fit_cannot():
    """A prompt step's launch (5 ms and more) outlasts the decode step before it (2-3 ms), so the GPU
    waits; the launch fit finds 3 ms + 0.02 ms a decoder + 0.004 ms a hashed token.  The wrong model
    for such a loop is a floor under each step's own price (``fit_host``): its window sums miss."""
    from prefixstudy.costmodel.step_cost import fit_host, fit_host_paired

    steps = busy_steps(launched_steps())
    h = fit_host_paired(steps)
    assert (h["c0_ms"], h["overlap"]) == (pytest.approx(3.0, abs=1e-3), "previous step")
    assert h["coef_ms"] == pytest.approx({"decode_tokens": 0.02, "prefix_queries": 0.004}, abs=1e-4)
    assert h["r2"] == pytest.approx(1.0, abs=1e-6) and (h["n_steps"], h["n_windows"]) == (128, 8)
    floor = fit_host(steps)
    assert floor["r2"] < 0.99 and "overlap" not in floor


def test_the_shifted_host_records_fitted_one_by_one_would_miss_the_host_s_own_work():
    """The wrong data for the window fit: the same records, each taken as its own step's host time
    (least squares over the steps, as a one-step-at-a-time fit would).  The wait a prompt's record
    hands to the next one lands on a decode-only step, and the fit smears it into the fixed cost:
    3.58 ms a step, decoders free, where the host takes 3 ms + 0.02 ms a decoder."""
    from prefixstudy.costmodel import engine_fit

    steps = gpu_span_steps()
    f = engine_fit.fit_arrays(engine_fit.design(steps), steps["host_step_ms"].to_numpy(float))
    one_by_one = dict(zip(("c0",) + engine_fit.TERMS, f.coef.round(4).tolist(), strict=True))
    assert one_by_one == {"c0": 3.5767, "prefill_tokens": 0.0048, "num_prefill_reqs": 0.0, "decode_tokens": 0.0,
                          "context_tokens": 0.0}


def test_a_host_window_is_16_steps_of_one_point_in_time_order():
    steps = busy_steps(pd.concat([gpu_span_steps().head(20).assign(rate=r) for r in (2.0, 1.0)], ignore_index=True))
    assert host_windows(steps).tolist() == [0] * 16 + [1] * 4 + [2] * 16 + [3] * 4
    assert (steps["rate"].tolist()[:20], steps["rate"].tolist()[20:]) == ([1.0] * 20, [2.0] * 20)


def test_an_async_calibration_without_gpu_spans_is_refused():
    df = gpu_span_steps().assign(timing="engine")
    with pytest.raises(UserError, match=r"--calibration x: it ran vLLM's async scheduling, but its steps are not all "
                                        r"timed on the GPU with host stamps beside them \(timing engine\); "
                                        r"no per-step cost to fit"):
        fit(df, source="x", async_scheduling=True)


def test_the_host_part_survives_a_save_and_a_sync_model_saves_as_before(tmp_path):
    m = fit_linear(gpu_span_steps(), async_scheduling=True)
    m.save(tmp_path / "a.json")
    assert CostModel.load(tmp_path / "a.json").host == m.host
    CostModel(2.0, {"decode_tokens": 0.05}).save(tmp_path / "s.json")
    saved = json.loads((tmp_path / "s.json").read_text())
    assert "host" not in saved and not CostModel.load(tmp_path / "s.json").pipelined


@pytest.mark.parametrize(("setting", "timing", "expected"), [
    ("null", "gpu-span", True),  # vLLM's default on an in-process GPU engine, the only one timed on the GPU
    ("null", "engine-async", True), ("null", "engine", False),
    ("false", "gpu-span", False),  # async scheduling turned off, steps still timed on the GPU
    ("true", "engine", True)])
def test_which_engine_a_calibration_ran_is_read_from_its_config_and_timing(tmp_path, setting, timing, expected):
    text = (REPO / "experiments/results/h200-tp1/config.yaml").read_text()
    assert "  async_scheduling: null\n" in text
    (tmp_path / "config.yaml").write_text(text.replace("  async_scheduling: null\n", f"  async_scheduling: {setting}\n"))
    assert async_recorded(tmp_path, pd.DataFrame({"timing": [timing] * 3})) is expected


def test_the_committed_default_engine_study_is_async_and_the_sync_one_is_not():
    from prefixstudy.costmodel.step_cost import fit_study

    assert fit_study(REPO / "experiments/results/h200-tp1").pipelined
    assert not fit_study(REPO / "experiments/results/h200-tp1-sync").pipelined


def test_pipelined_alone_a_request_runs_as_one_step_at_a_time(make_sim):
    """Step 2 (a decode) is scheduled before step 1's token is known, on a placeholder; the
    scheduler skips a fourth step, sure that the third reached max_tokens.  Back to back on the GPU,
    the tokens come when each step ends: as without async scheduling (test_driver)."""
    sim = make_sim("on", async_scheduling=True)
    assert sim.pipelined and sim.lane.pipelined
    tr = sim.run([SimRequest("a", list(range(100, 200)), 3, 0.0)])["a"]
    assert tr.token_times == pytest.approx([0.002, 0.0031, 0.0042]) and tr.scheduled_s == 0.0
    assert [s["step_ms"] for s in sim.steps] == pytest.approx([2.0, 1.1, 1.1])
    assert [s["step_start_s"] for s in sim.steps] == pytest.approx([0.0, 0.002, 0.0031])
    assert sim.in_flight is None and not sim.unfinished()


def test_on_a_vllm_release_the_async_lane_has_not_been_checked_on_every_step_is_vllms(make_sim, monkeypatch):
    """The AsyncScheduler's bookkeeping differs between releases: the lane takes it only on the
    releases its comparisons passed on, and still takes a one-step-at-a-time scheduler."""
    from prefixstudy.sim import lane_scope

    assert lane_scope.ASYNC_CHECKED_RELEASES == ("0.26.", "0.32.")
    monkeypatch.setattr(lane_scope, "ASYNC_CHECKED_RELEASES", ("0.26.",))
    assert make_sim("on", async_scheduling=True).lane is None
    assert make_sim("on").lane is not None


def _lane_cases() -> set[str]:
    """Every case benchmarks/lane_check.py runs, labelled as it prints them."""
    from tests.unit.sim import test_fast_path

    return {label for _, calls in load_script("benchmarks/lane_check.py").cases(test_fast_path)
            for label, _ in calls}


def _lane_record_problems(text: str, release: str, cases: set[str]) -> list[str]:
    lines = text.splitlines()
    passed = {line.split()[1] for line in lines if line.startswith("PASS ")}
    return ([] if f"vllm {release}" in {line[:len(release) + 5] for line in lines} else [f"not vLLM {release}"]) + \
        [f"failed: {line.split()[1]}" for line in lines if line.startswith("FAIL ")] + \
        [f"not run: {c}" for c in sorted(cases - passed)]


def test_every_checked_release_but_the_installed_one_has_a_lane_check_where_every_case_passed():
    """The lane takes an AsyncScheduler only on releases its comparisons passed on.  The installed
    release runs them in this suite (test_fast_path); any other needs a committed
    benchmarks/lane_check.py record of that release (the newest) in which every case of test_fast_path,
    each of its parameters, the async ones included, passed and none failed.  The same record with a
    case failed, or without the async cases (the older record of 0.26), is refused."""
    import vllm

    from prefixstudy.sim import lane_scope

    cases = _lane_cases()
    assert len([c for c in cases if c.endswith("[async]")]) == 6
    others = [r for r in lane_scope.ASYNC_CHECKED_RELEASES if not str(vllm.__version__).startswith(r)]
    assert others == ["0.26."]
    results = Path(__file__).resolve().parents[3] / "benchmarks/results"
    records = sorted(results.glob("lane_check_vllm026_*.txt"))
    text = records[-1].read_text()
    assert _lane_record_problems(text, "0.26.", cases) == []
    one_failed = text.replace("PASS test_multi_turn_sessions_are_the_same[async]",
                              "FAIL test_multi_turn_sessions_are_the_same[async]")
    assert _lane_record_problems(one_failed, "0.26.", cases) == [
        "failed: test_multi_turn_sessions_are_the_same[async]",
        "not run: test_multi_turn_sessions_are_the_same[async]"]
    older = records[0].read_text()
    assert records[0].name == "lane_check_vllm026_20261202.txt"
    assert [p for p in _lane_record_problems(older, "0.26.", cases) if p.endswith("[async]")] == \
        [f"not run: {c}" for c in sorted(c for c in cases if c.endswith("[async]"))]
    assert _lane_record_problems(text, "0.25.", cases) == ["not vLLM 0.25."]


def test_an_arrival_during_a_step_joins_one_step_later_than_without_async(make_sim):
    """b arrives at 1 ms, while step 1 (a's 100-token prompt, 0-2 ms) runs.  One step at a time, step 2
    (2-3.6 ms) takes b's 50-token prompt and a's decode: 1 + 0.5 + 0.1 ms.  Pipelined, step 2 was
    scheduled at 0 ms, when step 1 started, without b: a's decode alone (2-3.1 ms); b is scheduled at
    2 ms, as step 1's output comes back, into step 3 (3.1-4.7 ms): one step more to b's first token.
    Step 4 is b's decode alone: a's last token is in flight in step 3, so the scheduler skips a."""
    reqs = [SimRequest("a", list(range(100, 200)), 3, 0.0), SimRequest("b", list(range(300, 350)), 2, 0.001)]
    sync = make_sim("on").run(reqs)["b"]
    assert sync.scheduled_s == pytest.approx(0.002) and sync.token_times[0] == pytest.approx(0.0036)
    sim = make_sim("on", async_scheduling=True)
    b = sim.run(reqs)["b"]
    assert b.scheduled_s == pytest.approx(0.002) and b.token_times == pytest.approx([0.0047, 0.0058])
    assert [(s["prefill_tokens"], s["decode_tokens"]) for s in sim.steps] == [(100, 0), (0, 1), (50, 1), (0, 1)]
    assert [s["t_s"] for s in sim.steps] == pytest.approx([0.002, 0.0031, 0.0047, 0.0058])


def test_pipelined_steps_cost_the_host_part_where_it_is_the_slower(make_sim):
    """GPU part the unit cost, host part 1.5 ms a step: the prompt step is the GPU's (2 ms), each
    decode step the host's (1.5 ms, not 1.1)."""
    cost = CostModel(1.0, {"prefill_tokens": 0.01, "decode_tokens": 0.1}, host={"c0_ms": 1.5, "coef_ms": {}})
    assert cost(StepFeatures(100, 0, 100, 1)) == unit_cost_ms(StepFeatures(100, 0, 100, 1)) == 2.0
    sim = make_sim("on", cost_ms=cost, async_scheduling=True)
    tr = sim.run([SimRequest("a", list(range(100, 200)), 3, 0.0)])["a"]
    assert tr.token_times == pytest.approx([0.002, 0.0035, 0.005])


def test_a_step_the_host_has_not_launched_waits_for_it(make_sim):
    """GPU part the unit cost; host part, the host's work to launch a step while the one before runs,
    1.5 ms + 0.01 ms a prompt token it hashes.  Step 1 (a's 100-token prompt) is launched at 2.5 ms and
    ends at 4.5.  Step 2 (a decode), scheduled then, is launched at 4.0, before step 1 ends: it runs
    4.5-5.6 ms.  Step 3, scheduled at 4.5, is launched at 6.0, after step 2 ended: the GPU waits
    0.4 ms, and it runs 6.0-7.1 ms.  With caching off nothing is hashed: step 1 runs 1.5-3.5 ms, and
    step 3 waits for its launch at 5.0 ms."""
    cost = CostModel(1.0, {"prefill_tokens": 0.01, "decode_tokens": 0.1},
                     host={"c0_ms": 1.5, "coef_ms": {"prefix_queries": 0.01}, "overlap": "previous step"})
    prompt = StepFeatures(100, 0, 100, 1, prompt_tokens_new=100, prefix_queries=100)
    assert cost.host_overlaps and cost(prompt) == 2.0 and cost.launch_ms(prompt) == pytest.approx(2.5)
    a = [SimRequest("a", list(range(100, 200)), 3, 0.0)]
    sim = make_sim("on", cost_ms=cost, async_scheduling=True)
    assert sim.run(a)["a"].token_times == pytest.approx([0.0045, 0.0056, 0.0071])
    assert [s["step_start_s"] for s in sim.steps] == pytest.approx([0.0025, 0.0045, 0.006])
    assert [s["step_ms"] for s in sim.steps] == pytest.approx([2.0, 1.1, 1.1])
    assert make_sim("off", cost_ms=cost, async_scheduling=True).run(a)["a"].token_times == \
        pytest.approx([0.0035, 0.0046, 0.0061])
    # the same host part as a floor under each step (fit_host's kind): max(GPU, 1.5 ms + hashing)
    floor = CostModel(1.0, {"prefill_tokens": 0.01, "decode_tokens": 0.1},
                      host={"c0_ms": 1.5, "coef_ms": {"prefix_queries": 0.01}})
    assert floor.launch_ms(prompt) == 0.0 and floor(prompt) == 2.5


def test_the_deadline_drops_the_step_in_flight(make_sim):
    """Steps end at 2, 3.1 and 4.2 ms; the clock passes the 4 ms deadline when step 3's output comes
    back, with step 4 in flight: it is dropped, the request aborted, the 4.2 ms token cut."""
    sim = make_sim("on", async_scheduling=True)
    tr = sim.run([SimRequest("a", list(range(100, 200)), 50, 0.0)], deadline_s=0.004)["a"]
    assert tr.token_times == pytest.approx([0.002, 0.0031])
    assert sim.in_flight is None and not sim.unfinished() and len(sim.steps) == 4


def test_the_roofline_transfer_scales_the_host_part_as_the_gpu_part():
    """Mistral-7B on one H200 to TP 2: each term of both parts by the same roofline ratio, each part's
    fixed cost less the source's roofline c0 plus the target's, a floor under each step or the host's
    launch of it alike; a term only the host has unchanged."""
    from prefixstudy.costmodel.arch import load_arch
    from prefixstudy.costmodel.gpus import get_gpu
    from prefixstudy.costmodel.roofline import Deployment
    from prefixstudy.costmodel.transfer import roofline_terms, transfer

    arch, h200 = load_arch(REPO / "prefixstudy/configs/models/mistral-7b-v0.3"), get_gpu("H200-SXM")
    src, dst = Deployment(arch, h200, 1), Deployment(arch, h200, 2)
    m = CostModel(4.0, {"prefill_tokens": 0.02}, host={"c0_ms": 5.0, "coef_ms": {"decode_tokens": 0.06}})
    t = transfer(m, src, dst, 1000.0)
    r1, r2 = roofline_terms(src, 1000.0), roofline_terms(dst, 1000.0)
    assert t.c0_ms == pytest.approx(4.0 - r1["c0"] + r2["c0"])
    assert t.host["c0_ms"] == pytest.approx(5.0 - r1["c0"] + r2["c0"])
    assert t.coef_ms == pytest.approx({"prefill_tokens": 0.02 * r2["prefill_tokens"] / r1["prefill_tokens"]})
    assert t.host["coef_ms"] == pytest.approx({"decode_tokens": 0.06 * r2["decode_tokens"] / r1["decode_tokens"]})
    assert transfer(CostModel(4.0, {"prefill_tokens": 0.02}), src, dst, 1000.0).host == {}
    # a host's launch of each step moves the same way; the prompt tokens it hashes are host work, unchanged
    host = {"c0_ms": 5.0, "coef_ms": {"decode_tokens": 0.06, "prefix_queries": 0.001}, "overlap": "previous step"}
    launched = transfer(CostModel(4.0, {"prefill_tokens": 0.02}, host=host), src, dst, 1000.0)
    assert launched.host == {"c0_ms": pytest.approx(5.0 - r1["c0"] + r2["c0"]), "overlap": "previous step",
                             "coef_ms": pytest.approx({"decode_tokens": t.host["coef_ms"]["decode_tokens"],
                                                       "prefix_queries": 0.001})}


def test_a_default_engine_calibration_without_kv_usage_is_refused_in_one_line():
    """The simulator's default-engine form prices the KV a step holds: steps whose KV usage or block
    count was not recorded cannot fit it, and the refusal names the run."""
    df = gpu_span_steps()
    with pytest.raises(UserError, match=r"^--calibration runs/x: its steps do not record the KV cache's usage with "
                                        r"its block count \(kv_cache_usage, manifest num_blocks\); no KV term to fit$"):
        fit(df, source="runs/x", async_scheduling=True)
    with pytest.raises(UserError, match="no KV term to fit"):
        fit(df.assign(kv_tokens=[float("nan")] + [0.0] * (len(df) - 1)), source="runs/x", async_scheduling=True)
    assert fit(df.assign(kv_tokens=0.0, prefix_queries=0), source="runs/x", async_scheduling=True).host_overlaps
