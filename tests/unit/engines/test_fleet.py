"""engines.fleet: a fleet of in-process echo replicas behind each policy, exact; a replica lost
mid-point fails only its requests, and a fresh one replaces it for the next point."""

from __future__ import annotations

import asyncio

import pandas as pd

from prefixstudy.config import load_config
from prefixstudy.engines.echo import EchoEngine
from prefixstudy.engines.fleet import LocalReplica, ReplicaLost
from prefixstudy.runner import ModeSession
from prefixstudy.workloads import load_rows

BASE = {"engine": {"kind": "echo", "block_size": 16}, "executor": "local", "replicas": 2,
        "dataset.kind": "groups", "dataset.groups": 3, "dataset.prefix_len": 64, "dataset.suffix_len": 8,
        "dataset.output_len": 4, "sweep.num_requests": 10, "sweep.warmup_requests": 0, "sweep.modes": ["on"]}


def run_points(overrides: dict, points, factory=None) -> list:
    cfg = load_config(None, {**BASE, **overrides})
    rows = load_rows(cfg)

    async def go():
        async with ModeSession(cfg, "on", rows, replica_factory=factory) as s:
            return [await s.run_point(rate, 0) for rate in points], s.engine

    return asyncio.run(go())


def measured(res) -> pd.DataFrame:
    return res.requests[~res.requests["warmup"]].sort_values("request_index")


def test_round_robin_scatters_prefixes_and_counts_misses_exactly():
    (res,), fleet = run_points({"router.policies": ["round_robin"]}, [100])
    m = measured(res)
    # Primes: group 0 -> 0, 1 -> 1, 2 -> 0; request i (group i % 3) -> replica (3 + i) % 2.
    assert list(m["replica"]) == [1, 0] * 5
    assert list(m["num_cached_tokens"]) == [0, 0, 0] + [64] * 7
    assert list(m["expected_cached_tokens"]) == list(m["num_cached_tokens"])  # each replica's own cache
    assert res.meta["status"] == "ok" and res.meta["router"] == {"policy": "round_robin", "replicas": 2, "spills": 0}
    assert [r["routed"] for r in res.meta["replicas"]] == [7, 6]  # primes included
    assert sorted(res.iterations["replica"].unique()) == [0, 1]


def test_affinity_keeps_each_group_on_one_replica_so_every_request_hits():
    (res,), _ = run_points({"router.policies": ["prefix_affinity"], "router.prefix_blocks": 2,
                            "router.load_bound": 10.0}, [100])
    m = measured(res)
    assert (m.groupby("group")["replica"].nunique() == 1).all()
    assert (m["num_cached_tokens"] == 64).all()


class _Dies(LocalReplica):
    """An echo replica whose engine dies at its ``after``-th request (a stand-in for a killed
    actor: the fleet's side of a lost replica is what is tested here)."""

    def __init__(self, engine, after: int):
        super().__init__(engine)
        self.after, self.n = after, 0

    async def generate(self, prompt, output_len, request_id, trace):
        self.n += 1
        if self.n >= self.after:
            self.engine.dead = True
            raise ReplicaLost("ActorDiedError: killed")
        return await super().generate(prompt, output_len, request_id, trace)


class _Factory:
    def __init__(self, cfg):
        self.cfg, self.made = cfg, []

    def make(self, replica: int, generation: int):
        self.made.append((replica, generation))
        eng = EchoEngine(self.cfg.model, self.cfg.engine, "on")
        # Replica 1's first life dies at its 8th request: the cold-start probe's 3 sends (runner.cold),
        # prime 1, then measured 0, 2, 4, and 6.
        return _Dies(eng, 8) if (replica, generation) == (1, 0) else LocalReplica(eng)


def test_a_lost_replica_fails_only_its_requests_and_is_replaced_for_the_next_point():
    cfg = load_config(None, {**BASE, "router.policies": ["round_robin"]})
    factory = _Factory(cfg)
    (first, second), fleet = run_points({"router.policies": ["round_robin"]}, [100, 100], factory)
    m = measured(first)
    assert len(m) == 10 and list(m["replica"]) == [1, 0] * 5
    # Replica 1 got the probe, prime 1 and measured 0, 2, 4, 6, 8: it died at measured 6 (its 8th request), and
    # measured 8, routed to it all the same, failed at once.
    assert list(m[m["error"] != ""]["request_index"]) == [6, 8]
    assert set(m[m["error"] != ""]["error"]) == {"ReplicaLost: ActorDiedError: killed"}
    assert (m[m["replica"] == 0]["error"] == "").all()
    assert first.meta["status"] == "failed"
    assert first.meta["error"] == "replica 1 lost during the point: ActorDiedError: killed"
    assert factory.made == [(0, 0), (1, 0), (1, 1)]
    assert second.meta["status"] == "ok" and (measured(second)["error"] == "").all()
    assert [(r["replica"], r["generation"]) for r in second.meta["replicas"]] == [(0, 0), (1, 1)]
    assert [(s["replica"], s["generation"]) for s in fleet.started] == [(0, 0), (1, 0), (1, 1)]
