"""metrics.replicas: per-replica table, balance and the policy verdicts on hand-made frames."""

from __future__ import annotations

import pandas as pd
import pytest

from prefixstudy.metrics.replicas import balance, replica_summary, replica_table, verdicts
from prefixstudy.schema import typed_iterations, typed_requests


def requests(replicas: list[int], cached: list[int], e2e: list[float]) -> pd.DataFrame:
    n = len(replicas)
    return typed_requests(pd.DataFrame({
        "mode": "on", "rate": 4.0, "repeat": 0, "request_index": range(n), "replica": replicas,
        "prompt_tokens": 100, "output_tokens": 8, "num_cached_tokens": cached, "expected_cached_tokens": cached,
        "scheduled_s": [i * 0.25 for i in range(n)], "sent_s": [i * 0.25 for i in range(n)], "e2e_ms": e2e,
        "ttft_ms": 10.0, "tpot_ms": 2.0, "error": ""}))


def steps(replica: int, ms: list[float]) -> pd.DataFrame:
    t = [sum(ms[:i]) / 1e3 for i in range(len(ms))]
    return pd.DataFrame({"mode": "on", "rate": 4.0, "repeat": 0, "replica": replica, "step_start_s": t,
                         "t_s": [a + b / 1e3 for a, b in zip(t, ms, strict=True)], "step_ms": ms})


def test_replica_table_and_balance():
    req = requests([0, 0, 0, 1], [0, 96, 96, 0], [40.0, 20.0, 20.0, 50.0])
    its = typed_iterations(pd.concat([steps(0, [10.0, 20.0, 30.0]), steps(1, [20.0])]))
    t = replica_table(req, its).set_index("replica")
    assert t["n_routed"].to_dict() == {0: 3, 1: 1}
    assert t.loc[0, "hit_rate_measured"] == pytest.approx(192 / 300) and t.loc[1, "hit_rate_measured"] == 0.0
    assert t["busy_s"].to_dict() == pytest.approx({0: 0.06, 1: 0.02})
    assert t.loc[0, "mean_e2e_ms"] == pytest.approx(80 / 3)
    b = balance(t.reset_index()).iloc[0]
    assert b["requests_imbalance"] == pytest.approx(3 / 2)  # max 3 over mean 2
    assert b["busy_imbalance"] == pytest.approx(0.06 / 0.04)


def two_repeats() -> tuple[pd.DataFrame, pd.DataFrame]:
    """Replica 0: E2E 40, 20, 20 then 10, 30 (and one failed request); replica 1: 50 every time."""
    r0 = requests([0, 0, 0, 1], [0, 96, 96, 0], [40.0, 20.0, 20.0, 50.0])
    r1 = requests([0, 1, 0, 1, 0], [0, 0, 96, 96, 0], [10.0, 50.0, 30.0, 50.0, 999.0]).assign(repeat=1)
    r1.loc[4, "error"] = "RuntimeError: boom"
    its = typed_iterations(pd.concat([steps(0, [10.0, 20.0, 30.0]), steps(1, [20.0]),
                                      steps(0, [5.0]).assign(repeat=1), steps(1, [15.0, 25.0]).assign(repeat=1)]))
    return pd.concat([r0, r1], ignore_index=True), its


def test_replica_summary_pools_the_repeats_with_a_t_interval_over_their_means():
    req, its = two_repeats()
    s = replica_summary({"round_robin": (req, its, None)}).set_index("replica")
    assert list(s["policy"]) == ["round_robin"] * 2 and list(s["mode"]) == ["on"] * 2
    assert s["rate"].tolist() == [4.0, 4.0] and s["n_repeats"].tolist() == [2, 2]
    assert s["n_routed"].to_dict() == {0: 6, 1: 3}  # totals over the repeats, the failed one included
    assert s["n_ok"].to_dict() == {0: 5, 1: 3} and s["n_failed"].to_dict() == {0: 1, 1: 0}
    assert s["busy_s"].to_dict() == pytest.approx({0: 0.065, 1: 0.06})
    # Prompt tokens served from the cache over counted requests of both repeats: 288 / 500, 96 / 300.
    assert s["hit_rate_measured"].to_dict() == pytest.approx({0: 0.576, 1: 0.32})
    assert s["hit_rate_expected"].to_dict() == pytest.approx({0: 0.576, 1: 0.32})
    assert s.loc[0, "mean_e2e_ms"] == pytest.approx(24.0)  # (40 + 20 + 20 + 10 + 30) / 5: 999 failed
    lo, hi = s.loc[0, "mean_e2e_lo"], s.loc[0, "mean_e2e_hi"]
    # Repeat means 80/3 and 20: sd/sqrt(2) = (20/3)/2 = 10/3, times t(0.975, 1 df) = 12.7062; the
    # lower end, 24 - 42.35, is cut at 0 ms (no latency is negative).
    assert (lo, hi) == pytest.approx((0.0, 24.0 + 12.7062 * 10 / 3), abs=1e-3)
    assert (s.loc[1, "mean_e2e_lo"], s.loc[1, "mean_e2e_ms"], s.loc[1, "mean_e2e_hi"]) == (50.0, 50.0, 50.0)
    assert s["saturated_share"].tolist() == [0.0, 0.0]
    again = replica_summary({"round_robin": two_repeats() + (None,)}).set_index("replica")
    assert (again.loc[0, "mean_e2e_lo"], again.loc[0, "mean_e2e_hi"]) == (lo, hi)  # seeded: the same interval


def test_replica_summary_one_row_per_policy_mode_rate_replica():
    req, its = two_repeats()
    off = req.assign(mode="off", num_cached_tokens=0)
    s = replica_summary({"a": (req, its, None), "b": (pd.concat([req, off], ignore_index=True), its, None)})
    assert list(zip(s["policy"], s["mode"], s["replica"], strict=True)) == [
        ("a", "on", 0), ("a", "on", 1), ("b", "off", 0), ("b", "off", 1), ("b", "on", 0), ("b", "on", 1)]
    b_off = s[(s["policy"] == "b") & (s["mode"] == "off")].set_index("replica")
    assert b_off["hit_rate_measured"].tolist() == [0.0, 0.0] and b_off["busy_s"].tolist() == [0.0, 0.0]  # no steps
    assert b_off.loc[0, "mean_e2e_ms"] == pytest.approx(24.0)


def row(policy, e2e, lo, hi, hit=0.5, busy=1.0, sat=0.0):
    return {"policy": policy, "mode": "on", "rate": 8.0, "mean_e2e_ms": e2e, "mean_e2e_lo": lo, "mean_e2e_hi": hi,
            "hit_rate_measured": hit, "busy_imbalance": busy, "saturated_share": sat}


def test_verdicts_follow_the_intervals():
    wins = pd.DataFrame([row("prefix_affinity", 90, 85, 95, 0.9, 1.3), row("round_robin", 120, 110, 130)])
    assert verdicts(wins) == [
        "8 req/s, cache ON: prefix_affinity's extra hits outweigh its imbalance: hit rate 0.900 vs 0.500, "
        "busy imbalance 1.30 vs 1.00, mean E2E 90.0 [85.0, 95.0] vs 120.0 [110.0, 130.0] ms"]
    loses = pd.DataFrame([row("prefix_affinity", 150, 140, 160, 0.9, 1.8, 1 / 3), row("round_robin", 120, 110, 130)])
    assert verdicts(loses)[0].startswith("8 req/s, cache ON: prefix_affinity's extra hits do not outweigh its "
                                         "imbalance (saturated in some repeat):")
    tie = pd.DataFrame([row("prefix_affinity", 118, 105, 125), row("round_robin", 120, 110, 130)])
    assert "no clear difference between prefix_affinity and round_robin (intervals overlap)" in verdicts(tie)[0]


def test_a_fleets_requests_in_system_are_summed_over_its_replicas():
    from prefixstudy.metrics.saturation import in_system

    def its(replica, n):  # steps every 0.1 s over [0, 3], n in the system throughout
        t = [i / 10 for i in range(31)]
        return pd.DataFrame({"replica": replica, "t_s": t, "num_running": n, "num_waiting": 0})

    assert in_system(its(0, 2), 0.0, 3.0) == (2.0, 2.0)
    assert in_system(pd.concat([its(0, 2), its(1, 5)]), 0.0, 3.0) == (7.0, 7.0)
