"""The capacity search run end to end on echo: on a queue whose capacity is known in closed form
each arm's final bracket holds it and is at most 10 % wide; a resumed search carries on from its
recorded points; each point runs its window; the CLI refuses a search it cannot run."""

from __future__ import annotations

import json
import math
import shutil

import pandas as pd
import pytest
from click.testing import CliRunner

from prefixstudy.cli import main
from prefixstudy.config import load_config
from prefixstudy.results.provenance import MANIFEST_KEYS
from prefixstudy.study.orchestrate import run_study

# A queue of C servers (echo's max_num_seqs) whose every request takes S = MS_PER_TOKEN x the prompt
# tokens it has not cached (ON caches the 432-token prefix, OFF nothing; one output token, no decode
# sleep), requests arriving every 1/rate s.  Its capacity is C / S: below it nobody waits; above it
# the request sent t s into the point waits t x (rate x S / C - 1), so past REQUEST_TIMEOUT_S - S it
# is unfinished and the point saturated.  The capacities (80.3 and 47.9 req/s) sit between the
# search's probes (76.1 | 83.0 and 45.3 | 49.4, 3-5 % either side), so the probes' verdicts do not
# hang on the client's own ~1 ms a request, and an edge window of 8 s makes a queue 3 % over capacity
# wait past the timeout.  REQUEST_TIMEOUT_S leaves OFF 0.16 s of slack for a stalled machine.
C, MS_PER_TOKEN, PREFIX, SUFFIX, REQUEST_TIMEOUT_S = 8, 0.15573, 432, 640, 0.33
QUEUE = {"engine": {"kind": "echo", "block_size": 16, "prefill_ms_per_token": MS_PER_TOKEN, "max_num_seqs": C},
         "executor": "local", "arrivals.process": "constant", "dataset.prefix_len": PREFIX,
         "dataset.suffix_len": SUFFIX, "dataset.output_len": 1, "sweep.num_requests": 20, "sweep.warmup_requests": 1,
         "sweep.request_timeout_s": REQUEST_TIMEOUT_S,
         "sweep.capacity_search": {"short_window_s": 2, "edge_window_s": 8, "max_rate": 256}}
SERVICE_MS = {"on": MS_PER_TOKEN * SUFFIX, "off": MS_PER_TOKEN * (PREFIX + SUFFIX)}

# Every request answered at once (no cost, no server limit): every rate is sustained up to max_rate.
FREE = {"engine": {"kind": "echo", "block_size": 16}, "executor": "local", "arrivals.process": "constant",
        "dataset.prefix_len": 32, "dataset.suffix_len": 16, "dataset.output_len": 2, "sweep.num_requests": 20,
        "sweep.warmup_requests": 0, "sweep.capacity_search": {"start_rate": 16, "max_rate": 64, "short_window_s": 1.5,
                                                              "edge_window_s": 2}}
LADDER = [(16.0, 0), (32.0, 0), (64.0, 0), (64.0, 1)]


def manifest(run) -> dict:
    return json.loads((run / "manifest.json").read_text())


def started(run) -> list[tuple[str, float, int]]:
    pts = sorted(manifest(run)["points"], key=lambda p: p["started_at"])
    return [(p["mode"], p["rate"], p["repeat"]) for p in pts]


@pytest.mark.slow
@pytest.mark.alone  # real time: the queue's waits are the answer
def test_each_arms_bracket_holds_the_queues_known_capacity_and_is_at_most_10_percent_wide(tmp_path):
    run = run_study(load_config(None, {**QUEUE, "out": str(tmp_path)}), progress=False)
    cap = pd.read_csv(run / "capacity.csv").set_index("mode")
    known = {arm: C / SERVICE_MS[arm] * 1e3 for arm in ("on", "off")}  # on 80.3, off 47.9 req/s
    for arm, capacity in known.items():
        r = cap.loc[arm]
        assert r["stopped"] == "converged", (arm, r.to_dict())
        assert r["sustained_req_s"] <= capacity <= r["saturated_req_s"], (arm, capacity, r.to_dict())
        assert r["bracket_width"] <= 1.10
        # both ends confirmed: two repeats each, all agreeing on this machine-independent queue
        assert (r["sustained_votes"], r["saturated_votes"]) == (r["sustained_repeats"], r["saturated_repeats"]) == (2, 2)
        # overloaded, it completed no faster than its capacity, and lost some of it to the requests that
        # timed out in service (each a part of S wasted)
        assert 0.85 * capacity <= r["ceiling_req_s"] <= capacity
    on = cap.loc["on"]
    ratio = SERVICE_MS["off"] / SERVICE_MS["on"]
    assert on["ratio_lo"] <= ratio <= on["ratio_hi"] and on["ratio_hi"] / on["ratio_lo"] <= 1.10 ** 2
    assert math.isnan(cap.loc["off", "ratio_vs_baseline"])
    m = manifest(run)
    assert m["status"] == "complete" and set(m) <= set(MANIFEST_KEYS)
    assert {a: s["stopped"] for a, s in m["capacity_search"]["arms"].items()} == {"on": "converged", "off": "converged"}


@pytest.fixture(scope="module")
def free_search(tmp_path_factory):
    return run_study(load_config(None, {**FREE, "out": str(tmp_path_factory.mktemp("free"))}), progress=False)


@pytest.mark.slow
def test_grid_points_run_the_short_window_and_the_confirming_repeat_the_edge_window(free_search):
    # doubling from 16 to max_rate 64, then its confirming repeat; who goes first flips each round
    assert started(free_search) == [("on", 16.0, 0), ("off", 16.0, 0), ("off", 32.0, 0), ("on", 32.0, 0),
                                    ("on", 64.0, 0), ("off", 64.0, 0), ("off", 64.0, 1), ("on", 64.0, 1)]
    s = pd.read_csv(free_search / "summary.csv")
    # 1.5 s of arrivals on the grid (20 requests at least), 2 s for the repeat next to the edge
    assert sorted(zip(s["rate"], s["repeat"], s["n_sent"], strict=True)) == \
        sorted([(16.0, 0, 24), (32.0, 0, 48), (64.0, 0, 96), (64.0, 1, 128)] * 2)
    cap = pd.read_csv(free_search / "capacity.csv").set_index("mode")
    assert list(cap["stopped"]) == ["max rate", "max rate"] and list(cap["sustained_rate_req_s"]) == [64.0, 64.0]
    assert cap["saturated_req_s"].isna().all() and cap.loc["on", "ratio_hi"] == math.inf


@pytest.mark.slow
def test_a_resumed_search_goes_on_from_its_recorded_points(free_search, tmp_path):
    run = tmp_path / free_search.name  # a copy of the finished search, cut back to its first two rounds
    shutil.copytree(free_search, run)
    m = manifest(run)
    first = sorted(m["points"], key=lambda p: p["started_at"])[:4]
    kept = {(p["mode"], p["rate"]): p["started_at"] for p in first}
    (run / "manifest.json").write_text(json.dumps({**m, "points": first, "status": "interrupted"}))
    (run / "capacity.csv").unlink()
    run_study(None, resume=run, progress=False)
    m = manifest(run)
    assert sorted((p["mode"], p["rate"], p["repeat"]) for p in m["points"]) == \
        sorted((a, r, k) for a in ("on", "off") for r, k in LADDER)
    assert {(p["mode"], p["rate"]): p["started_at"] for p in m["points"] if (p["mode"], p["rate"]) in kept} == kept
    assert m["capacity_search"]["arms"]["on"]["rates_tried_req_s"] == [16.0, 32.0, 64.0]
    assert pd.read_csv(run / "capacity.csv")["stopped"].tolist() == ["max rate", "max rate"]


@pytest.mark.slow
def test_rederiving_a_search_rewrites_a_stale_answer_from_its_points(free_search, tmp_path):
    from prefixstudy.results.rederive import rederive

    run = tmp_path / free_search.name
    shutil.copytree(free_search, run)
    good = pd.read_csv(run / "capacity.csv")
    # wrong data: an answer its points do not give (OFF stopped short of max_rate)
    (run / "capacity.csv").write_text(good.assign(stopped=["max rate", "converged"], sustained_req_s=[64.0, 30.0])
                                      .to_csv(index=False))
    rederive(run)
    pd.testing.assert_frame_equal(pd.read_csv(run / "capacity.csv"), good)
    assert manifest(run)["capacity_search"] == manifest(free_search)["capacity_search"]


@pytest.mark.parametrize(("args", "says"), [
    (["--capacity", "--slo", "e2e_p90:100"], "--capacity and --slo"),
    (["--capacity", "--rates", "1,2"], "--capacity searches its own rates"),
    (["--set", "sweep.capacity_search.start_rate=8", "--rates", "1,2"], "--rates: a capacity search"),
    (["--capacity", "--set", "sweep.capacity_search.growth=0.5"], "field 'sweep.capacity_search.growth'"),
    (["--capacity", "--set", "sweep.max_concurrency=2"], "field 'sweep'")])
def test_the_cli_refuses_a_search_it_cannot_run_in_one_line(tmp_path, args, says):
    res = CliRunner().invoke(main, ["run", "try-echo", "--out", str(tmp_path), *args])
    assert res.exit_code == 2, res.output
    assert says in res.output and len(res.output.strip().splitlines()) == 1
    assert not any(tmp_path.iterdir())


def test_the_dry_run_states_the_searchs_settings_and_the_sets_reach_it(tmp_path):
    res = CliRunner().invoke(main, ["run", "try-echo", "--out", str(tmp_path), "--capacity", "--dry-run",
                                    "--set", "sweep.capacity_search.start_rate=8"])
    assert res.exit_code == 0, res.output
    line = next(x for x in res.output.splitlines() if x.startswith("capacity search:"))
    assert "from 8 req/s" in line and "60 s near the edge" in line
