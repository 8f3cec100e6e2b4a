"""The SLO search run end to end on echo: the rounds go through the study's point loop (one run
folder, the arms taking turns), a resumed search carries on from its recorded points, and on an
echo queue whose answer is known in closed form the search finds it within its tolerance."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pandas as pd
import pytest

from prefixstudy.config import load_config
from prefixstudy.study.orchestrate import run_study

# Every request takes two 5 ms decode steps and none waits for another: the objective holds at every
# rate, so each arm's search doubles up to max_rate.  Two requests a point leave no rule of the
# saturation check that a clock can fire: the completion rule needs three arrivals and the backlog
# trend ten, echo has no admission limit and never has a request waiting, and a point runs until
# both are answered (its cap is 900 s).  So a loaded machine's stall cannot make a point saturated
# and turn the search, and these runs share the machine (at 6 requests a point, a stall of 1/64 s at
# a point's end was enough).
FREE = {"engine": {"kind": "echo", "block_size": 16, "decode_ms_per_token": 5}, "executor": "local",
        "arrivals.process": "constant", "dataset.prefix_len": 32, "dataset.suffix_len": 16, "dataset.output_len": 2,
        "sweep.num_requests": 2, "sweep.warmup_requests": 0, "sweep.repeats": 2, "sweep.rates": [8, 64],
        "sweep.slo": {"objectives": {"e2e_p90": 5000}}}
LADDER = [(8.0, 0), (16.0, 0), (32.0, 0), (64.0, 0), (64.0, 1)]


def manifest(run) -> dict:
    return json.loads((run / "manifest.json").read_text())


def started(run) -> list[tuple[str, float, int]]:
    pts = sorted(manifest(run)["points"], key=lambda p: p["started_at"])
    return [(p["mode"], p["rate"], p["repeat"]) for p in pts]


@pytest.fixture(scope="module")
def free_search(tmp_path_factory):
    """One finished FREE search (its run folder), and the arms whose engines it opened, in order."""
    from prefixstudy.executors import local

    opened = []

    class Counted(local.ModeSession):
        def __init__(self, cfg, mode, *a, **k):
            opened.append(mode)
            super().__init__(cfg, mode, *a, **k)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(local, "ModeSession", Counted)
        run = run_study(load_config(None, {**FREE, "out": str(tmp_path_factory.mktemp("free"))}), progress=False)
    return run, opened


@pytest.mark.slow
def test_rounds_run_as_points_of_one_folder_and_the_arms_take_turns(free_search):
    run, opened = free_search
    assert opened == ["on", "off"]  # one engine per arm, kept up through the five rounds
    # doubling from 8 (the lowest of sweep.rates) to 64 (the highest), then the second repeat there;
    # who goes first flips each round
    assert started(run) == [("on", 8.0, 0), ("off", 8.0, 0), ("off", 16.0, 0), ("on", 16.0, 0),
                            ("on", 32.0, 0), ("off", 32.0, 0), ("off", 64.0, 0), ("on", 64.0, 0),
                            ("on", 64.0, 1), ("off", 64.0, 1)]
    m = manifest(run)
    assert m["status"] == "complete"
    for arm in ("on", "off"):
        assert m["slo_search"]["arms"][arm] == {"rates_tried_req_s": [8.0, 16.0, 32.0, 64.0], "lo_req_s": 64.0,
                                                "hi_req_s": None, "hi_verdict": None, "final_rate_req_s": 64.0,
                                                "repeats_met": 2, "stopped": "max rate"}
    slo = pd.read_csv(run / "slo.csv")
    summary = pd.read_csv(run / "summary.csv")
    # every probe is an ordinary point: one summary row each, and its p90 E2E is the one the search used
    assert sorted(zip(slo["arm"], slo["rate_req_s"], slo["repeat"], strict=True)) == \
        sorted(zip(summary["mode"], summary["rate"], summary["repeat"], strict=True))
    both = slo.merge(summary, left_on=["arm", "rate_req_s", "repeat"], right_on=["mode", "rate", "repeat"])
    assert np.allclose(both["e2e_p90_ms"], both["p90_e2e_ms"])
    assert set(slo["verdict"]) == {"met"}
    # no rule of the saturation check could fire (FREE's two requests a point): three had nothing to
    # judge, and echo's rows, where one falls in a window's last half, never have a request waiting
    assert summary[["completion_ratio", "backlog_growth_per_s", "full_share"]].isna().all().all()
    assert set(summary["waiting_share"].fillna(0.0)) == {0.0}
    assert not summary["saturated"].any()


@pytest.mark.slow
def test_without_interleaving_each_round_runs_one_arm_after_the_other(tmp_path):
    run = run_study(load_config(None, {**FREE, "out": str(tmp_path), "sweep.interleave_arms": False}),
                    progress=False)
    # one config per arm and round, in an order that flips each round (and again for a second repeat)
    assert started(run) == [("on", 8.0, 0), ("off", 8.0, 0), ("off", 16.0, 0), ("on", 16.0, 0),
                            ("on", 32.0, 0), ("off", 32.0, 0), ("off", 64.0, 0), ("on", 64.0, 0),
                            ("off", 64.0, 1), ("on", 64.0, 1)]
    assert manifest(run)["slo_search"]["arms"]["off"]["stopped"] == "max rate"


@pytest.mark.slow
def test_a_resumed_search_goes_on_from_its_recorded_points(free_search, tmp_path):
    run = tmp_path / free_search[0].name  # a copy of the finished search, cut back to its first two rounds
    shutil.copytree(free_search[0], run)
    m = manifest(run)
    first = sorted(m["points"], key=lambda p: p["started_at"])[:4]  # as if stopped after two rounds
    kept = {(p["mode"], p["rate"]): p["started_at"] for p in first}
    (run / "manifest.json").write_text(json.dumps({**m, "points": first, "status": "interrupted"}))
    run_study(None, resume=run, progress=False)
    m = manifest(run)
    assert sorted((p["mode"], p["rate"], p["repeat"]) for p in m["points"]) == \
        sorted((a, r, k) for a in ("on", "off") for r, k in LADDER)
    assert {(p["mode"], p["rate"]): p["started_at"] for p in m["points"] if (p["mode"], p["rate"]) in kept} == kept
    assert m["slo_search"]["arms"]["on"]["rates_tried_req_s"] == [8.0, 16.0, 32.0, 64.0]
    assert len(pd.read_csv(run / "slo.csv")) == 10


# A queue of C servers, each request's service S ms (echo: prefill_ms_per_token x the prompt tokens
# it has not cached), requests arriving every 1/rate s.  Below the capacity C / S nobody waits;
# above it request n (0-based) waits floor(n / C) x (S - C / rate) (it takes the server request
# n - C frees).  So p90 E2E = S + k90 x (S - C / rate), k90 the 90th percentile of floor(n / C)
# over the N requests, and the highest rate meeting p90 <= T is C / (S - (T - S) / k90).
C, N, T_MS, MS_PER_TOKEN, PREFIX, SUFFIX = 4, 60, 120.0, 0.08, 256, 768
QUEUE = {"engine": {"kind": "echo", "block_size": 16, "prefill_ms_per_token": MS_PER_TOKEN, "max_num_seqs": C},
         "executor": "local", "arrivals.process": "constant", "dataset.prefix_len": PREFIX,
         "dataset.suffix_len": SUFFIX, "dataset.output_len": 1, "sweep.num_requests": N, "sweep.warmup_requests": 1,
         "sweep.repeats": 2, "sweep.rates": [32, 200],  # the search's start and its ceiling
         "sweep.slo": {"objectives": {"e2e_p90": T_MS}, "tolerance": 0.05}}


def known_answer(service_ms: float) -> tuple[float, float]:
    """(capacity, highest rate meeting p90 E2E <= T), req/s."""
    k90 = float(np.percentile([n // C for n in range(N)], 90))
    return C / service_ms * 1e3, C / (service_ms - (T_MS - service_ms) / k90) * 1e3


@pytest.mark.slow
@pytest.mark.alone  # real time: its latencies are the answer
def test_the_search_finds_an_echo_queues_known_answer_within_its_tolerance(tmp_path):
    run = run_study(load_config(None, {**QUEUE, "out": str(tmp_path)}), progress=False)
    arms = manifest(run)["slo_search"]["arms"]
    service = {"off": MS_PER_TOKEN * (PREFIX + SUFFIX), "on": MS_PER_TOKEN * SUFFIX}  # ON serves the prefix cached
    for arm, s in arms.items():
        cap, answer = known_answer(service[arm])  # off: 48.8 and 50.6 req/s; on: 65.1 and 70.3
        assert s["stopped"] in ("converged", "saturated") and s["repeats_met"] == 2
        assert s["hi_req_s"] <= s["lo_req_s"] * 1.05
        # The answer is `answer`, or the capacity where the saturation check calls the slowly growing
        # queue between the two saturated; the search ends at most 5 % below it.  3 % more below for
        # what the client clock adds to each request (about 1 ms on S of 60-80 ms) and timer slack.
        assert cap / 1.05 * 0.97 <= s["lo_req_s"] <= answer, (arm, s)
        assert s["hi_req_s"] >= cap * 0.97, (arm, s)


def test_a_round_that_records_no_point_stops_the_run_instead_of_asking_again(tmp_path, monkeypatch):
    import prefixstudy.study.orchestrate as study_module
    from prefixstudy.errors import StudyFailed

    class RunsNothing:
        name = "local"

        def run(self, cfg, plan, rows, sink, progress=True):
            pass

    monkeypatch.setattr(study_module, "pick_executor", lambda cfg: RunsNothing())
    with pytest.raises(StudyFailed, match="SLO search: a round recorded no point"):
        run_study(load_config(None, {**FREE, "out": str(tmp_path)}), progress=False)
    run = next((tmp_path / "default").iterdir())
    assert manifest(run)["status"] == "failed"
    assert manifest(run)["slo_search"]["arms"]["on"]["rates_tried_req_s"] == []
