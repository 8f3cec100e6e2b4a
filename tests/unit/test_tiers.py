"""A CPU tier under the prefix cache, end to end on the echo backend: the engine's cached tokens by
tier in summary.csv, and the cache model's expected and estimated hits with the tier in them.

Worked by hand: 16-token blocks, 2 groups of 64 shared + 16 unique tokens, 1 output token (5 whole
blocks a request), in round-robin order, each group's prefix primed first.  The GPU pool has 8
blocks (7 usable, vLLM's null block aside): one request's 5 and two more, so the other group's
prefix is mostly evicted before it comes back.  A 64-block tier holds every prompt block the
point stores (2 x 4 prefix + 8 x 1 unique = 16), so every request finds its whole 64-token prefix
in one tier or the other: hit 64 / 80 = 0.8, the infinite-cache bound.
"""

from __future__ import annotations

import math

import pytest

from prefixstudy.config import load_config
from prefixstudy.executors import point_line
from prefixstudy.results import load
from prefixstudy.study.orchestrate import run_study

# Its module fixtures take seconds (studies, reports, venvs): the whole file runs in `make test`, not `make test-fast`.
pytestmark = pytest.mark.slow

# One request open at a time (max_concurrency 1): the blocks a request finds are then the arrival
# order's alone.  Echo answers at once, but on a loaded machine a stall let two requests overlap,
# and the pinned blocks changed what the pool evicted (ON's GPU hits 304 tokens, not 272).
ECHO = {"engine": {"kind": "echo", "block_size": 16, "num_blocks": 8}, "executor": "local",
        "arrivals.process": "constant", "dataset.kind": "groups", "dataset.groups": 2, "dataset.prefix_len": 64,
        "dataset.suffix_len": 16, "dataset.output_len": 1, "dataset.mix": {"order": "round_robin"},
        "sweep.num_requests": 8, "sweep.warmup_requests": 0, "sweep.rates": [50, 100], "sweep.max_concurrency": 1}


def study(tmp_path, tier_blocks: int):
    cfg = load_config(None, {**ECHO, "out": str(tmp_path),
                             "arms": [{"name": "on-tier", "engine": {"tier_blocks": tier_blocks}}]})
    return load(run_study(cfg, progress=False))


@pytest.fixture(scope="module")
def tiered(tmp_path_factory):
    return study(tmp_path_factory.mktemp("tier64"), 64)


def test_the_tier_serves_what_the_pool_evicted_and_the_engine_says_which(tiered):
    s = tiered.summary.set_index(["mode", "rate"])
    for rate in (50.0, 100.0):
        on, tier, off = s.loc[("on", rate)], s.loc[("on-tier", rate)], s.loc[("off", rate)]
        # The pool alone keeps 3 blocks of the first request's prefix and 2 of every later one's:
        # 48 + 7 x 32 = 272 of 640 prompt tokens.
        assert (on["hit_rate_measured"], on["cached_tokens_gpu"]) == (272 / 640, 272)
        assert math.isnan(on["cached_tokens_cpu"])  # no tier: the engine has no such number
        # The same pool under the tier holds the same blocks (loaded blocks are cached as computed
        # ones), so the GPU part is ON's and the tier serves the rest of each 64-token prefix.
        assert (tier["cached_tokens_gpu"], tier["cached_tokens_cpu"]) == (272, 8 * 64 - 272)
        assert tier["hit_rate_measured"] == tier["hit_rate_expected"] == tier["hit_rate_estimated"] == 0.8
        assert (off["cached_tokens_gpu"], off["hit_rate_measured"]) == (0, 0.0)
    assert tiered.summary["hit_rate_ok"].all()


def test_the_estimate_replays_the_tier_request_by_request(tiered):
    r = tiered.requests[~tiered.requests["warmup"]]
    t = r[r["mode"] == "on-tier"]
    assert (t["num_cached_tokens"] == t["estimated_cached_tokens"]).all()
    assert (t["expected_cached_tokens"] == 64).all()


def test_no_eviction_flag_where_the_tier_holds_what_the_pool_evicted(tiered):
    rows = {(r["mode"], r["rate"]): r.to_dict() for _, r in tiered.summary.iterrows()}
    assert "EVICTION (cache holds 0.425 of 0.800)" in point_line("on", 50.0, rows[("on", 50.0)])
    line = point_line("on-tier", 50.0, rows[("on-tier", 50.0)])
    assert "EVICTION" not in line and "MISMATCH" not in line and "hit 0.800" in line


def test_every_point_starts_with_an_empty_tier(tiered):
    # The 100 req/s point replays the 50 req/s point's rows: a tier kept from it would serve their
    # whole prompts (80 tokens, above the bound).  Both points are the same, request by request.
    r = tiered.requests[(tiered.requests["mode"] == "on-tier") & ~tiered.requests["warmup"]]
    by_rate = {rate: g.sort_values("request_index")["num_cached_tokens"].tolist() for rate, g in r.groupby("rate")}
    assert by_rate[50.0] == by_rate[100.0] == [64] * 8


def test_a_tier_too_small_for_the_working_set_is_caught_by_the_estimate(tmp_path):
    # 6 blocks hold one request's 5 and one more: the primes leave the first group's last two
    # prefix blocks in the tier, so only the first request gets its 4th block from there (16 tokens).
    s = study(tmp_path, 6).summary.set_index(["mode", "rate"])
    tier = s.loc[("on-tier", 50.0)]
    assert (tier["cached_tokens_gpu"], tier["cached_tokens_cpu"]) == (272, 16)
    assert tier["hit_rate_estimated"] == tier["hit_rate_measured"] == 288 / 640 < tier["hit_rate_expected"] == 0.8


def test_arms_csv_and_the_report_carry_the_engine_s_split(tiered):
    from prefixstudy.report import arms as report_arms

    a = tiered.arms.set_index(["arm", "rate"])
    tier, on = a.loc[("on-tier", 50.0)], a.loc[("on", 50.0)]
    assert (tier["hit_rate_gpu"], tier["hit_rate_cpu"], tier["hit_rate"]) == (272 / 640, 240 / 640, 0.8)
    assert on["hit_rate_gpu"] == 272 / 640 and math.isnan(on["hit_rate_cpu"])
    t = report_arms.table(tiered.arms)
    col = "hit rate, engine: GPU + CPU tier"
    assert set(t.loc[t["arm"] == "on-tier", col]) == {"0.425 + 0.375"}
    assert set(t.loc[t["arm"] == "on", col]) == {"0.425"}
    said = " ".join(report_arms.sentences(tiered.arms))
    assert "hit rate 0.800, 0.375 of it from the CPU tier (the engine's count)" in said


# ----------------------------------------------------------------- capacity: the tier's size as an axis

def test_capacity_sweeps_the_tier_beside_the_gpu_cache(tmp_path):
    from prefixstudy.sweep.capacity_axis import capacity_table
    from tests.sweeps import capacity_sweep

    cfg = load_config(None, {**ECHO, "out": str(tmp_path), "sweep.rates": [50],
                             "arms": [{"name": "on-tier", "engine": {}}]})
    t = capacity_table(capacity_sweep(cfg, "tier_blocks", [0, 6, 64]))
    t = t.set_index(["capacity", "mode"])
    # ON is the GPU cache alone at every tier size; the arm gets the tier: none, too small, enough.
    assert [t.loc[(c, "on"), "hit_rate_measured"] for c in (0, 6, 64)] == [272 / 640] * 3
    assert [t.loc[(c, "on-tier"), "hit_rate_measured"] for c in (0, 6, 64)] == [272 / 640, 288 / 640, 0.8]
    assert [t.loc[(c, "on-tier"), "tier_blocks"] for c in (0, 6, 64)] == [0, 6, 64]
    assert [t.loc[(c, "on-tier"), "cached_tokens_cpu"] for c in (6, 64)] == [16, 240]
    assert math.isnan(t.loc[(0, "on-tier"), "cached_tokens_cpu"])  # no tier: the engine has no such number
    assert (t.loc[(64, "on"), "tier_blocks"], t.loc[(64, "off"), "hit_rate_measured"]) == (0, 0.0)
    assert t["hit_rate_ok"].all()


def test_tier_capacities_are_checked_before_anything_starts():
    from prefixstudy.sweep.capacity_axis import capacity_config, parse_capacity
    from prefixstudy.errors import UserError

    assert parse_capacity("offload_gib=0,4,8,16,32") == ("offload_gib", [0, 4, 8, 16, 32])
    with pytest.raises(UserError, match=r"^--capacity 'offload_gib=-1': values must be finite numbers >= 0 \(0: no tier\)$"):
        parse_capacity("offload_gib=-1")
    with pytest.raises(UserError, match=r"^--capacity 'blocks=0': values must be finite numbers > 0$"):
        parse_capacity("blocks=0")
    echo = load_config(None, ECHO)
    with pytest.raises(UserError, match=r"^--capacity tier_blocks: the tier goes to the study's own arms that cache"):
        capacity_config(echo, "tier_blocks", 8)
    with pytest.raises(UserError, match=r"^--capacity offload_gib: engine.kind echo has no such tier"):
        capacity_config(load_config(None, {**ECHO, "arms": [{"name": "t"}]}), "offload_gib", 8)
    # vLLM: the tier is the arm's offload (kv_offloading_size), 0 takes it away; ON and OFF keep none.
    vllm = load_config(None, {"engine": {"kind": "vllm"}, "device": "cuda",
                              "arms": [{"name": "on-cpu", "offload": {"size_gib": 2}}]})
    sub = capacity_config(vllm, "offload_gib", 16)
    assert sub.arm_engine("on-cpu").extra_args == {"kv_offloading_size": 16, "kv_offloading_backend": "native"}
    assert "kv_offloading_size" not in sub.arm_engine("on").extra_args
    assert "kv_offloading_size" not in capacity_config(vllm, "offload_gib", 0).arm_engine("on-cpu").extra_args


# ----------------------------------------------------------------- is a CPU tier worth it here

def test_the_tier_is_weighed_against_the_same_cache_without_it(tiered):
    from prefixstudy.metrics.headline import tiers_versus_cache
    from prefixstudy.report import arms as report_arms

    t = tiers_versus_cache(tiered.requests, tiered.summary, tiered.arms)
    assert list(zip(t["arm"], t["baseline"], t["rate"], strict=True)) == [("on-tier", "on", 50.0), ("on-tier", "on", 100.0)]
    assert list(t["hit_rate_cpu"]) == [240 / 640] * 2 and list(t["hit_rate"]) == [0.8] * 2
    # The paired gain over ON is arms.csv's gain over OFF re-based on ON, request by request: the
    # same means, so its sign and size follow from the two rows arms.csv already has.
    a = tiered.arms.set_index(["arm", "rate"])
    for _, r in t.iterrows():
        on, tier = a.loc[("on", r["rate"]), "mean_e2e_ms"], a.loc[("on-tier", r["rate"]), "mean_e2e_ms"]
        assert r["baseline_mean_e2e_ms"] == pytest.approx(on) and r["mean_e2e_ms"] == pytest.approx(tier)
        assert r["gain_mean_e2e"] == pytest.approx((on - tier) / on)
    said = report_arms.tier_sentences(t)
    assert len(said) == 1 and said[0].startswith("Is a CPU tier worth it here? arm on-tier: ")
    assert "hit rate 0.800 of 0.800 possible, 0.375 from the CPU tier (the engine's count)." in said[0]
    # No tier arm, or no ON to weigh it against: nothing to say.
    assert tiers_versus_cache(tiered.requests, tiered.summary, tiered.arms[tiered.arms["arm"] == "on"]).empty
    assert tiers_versus_cache(tiered.requests, tiered.summary[tiered.summary["mode"] != "on"], tiered.arms).empty


def _tier_row(rate, gain, lo, hi, sat=False, base_sat=False, served=0.65, hit=0.896):
    return {"rate": rate, "arm": "on-cpu32", "baseline": "on", "arrival_rate": rate * 0.9, "gain_mean_e2e": gain,
            "gain_mean_e2e_lo": lo, "gain_mean_e2e_hi": hi, "saturated": sat, "baseline_saturated": base_sat,
            "gain_is_bound": sat or base_sat, "hit_rate": hit, "hit_rate_expected": 0.896, "hit_rate_cpu": served}


@pytest.mark.parametrize("rows, verdict", [
    ([_tier_row(4, 0.165, 0.066, 0.263), _tier_row(16, 0.571, 0.564, 0.577, True, True)], "yes"),
    # Kept up while ON saturated: a lower bound above 0 is a yes too.
    ([_tier_row(4, 0.01, -0.02, 0.04), _tier_row(16, 0.4, 0.3, 0.5, False, True)], "yes"),
    # Only where both saturated is the interval above 0: that bounds nothing.
    ([_tier_row(4, 0.01, -0.02, 0.04), _tier_row(16, 0.4, 0.3, 0.5, True, True)], "no measurable difference"),
    ([_tier_row(4, -0.05, -0.08, -0.02), _tier_row(16, 0.01, -0.1, 0.1)], "no, it costs time"),
    ([_tier_row(4, 0.038, -0.023, 0.1, served=0.0)], "no: the tier served no prompt tokens, the GPU cache kept what came back"),
    ([_tier_row(4, -0.048, -0.313, 0.217, served=0.0, hit=0.244)],
     "no: the tier served no prompt tokens, it is too small to hold what the GPU cache evicted before it came back"),
])
def test_the_tier_verdict(rows, verdict):
    import pandas as pd

    from prefixstudy.report import arms as report_arms

    said = report_arms.tier_sentences(pd.DataFrame(rows), {"on-cpu32": 32})
    assert said[0].startswith(f"Is a CPU tier worth it here? arm on-cpu32 (32 GiB): {verdict}. Against caching ON alone")


def test_a_gain_is_marked_by_who_saturated():
    import pandas as pd

    from prefixstudy.report import arms as report_arms

    rows = [_tier_row(4, 0.1, 0.05, 0.15), _tier_row(8, 0.2, 0.1, 0.3, False, True),
            _tier_row(16, 0.3, 0.2, 0.4, True, False), _tier_row(24, 0.4, 0.3, 0.5, True, True)]
    said = report_arms.tier_sentences(pd.DataFrame(rows))[0]
    assert ("its gain in mean E2E is 10.0 % [5.0, 15.0] at 3.60 req/s; "
            "≥ 20.0 % [10.0, 30.0] at 7.20 req/s (caching ON saturated in a repeat); "
            "≤ 30.0 % [20.0, 40.0] at 14.40 req/s (arm on-cpu32 saturated in a repeat); "
            "⚠ 40.0 % [30.0, 50.0] at 21.60 req/s (both saturated in a repeat) (paired by request") in said
