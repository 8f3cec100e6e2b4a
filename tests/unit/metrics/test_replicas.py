"""metrics.replicas: per-replica table, balance and the policy verdicts on hand-made frames."""

from __future__ import annotations

import pandas as pd
import pytest

from prefixstudy.metrics.replicas import balance, replica_table, verdicts
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
                         "t_s": [a + b / 1e3 for a, b in zip(t, ms)], "step_ms": ms})


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
