"""The runner and the local executor, through the engine protocol, on the echo backend: every
request accounted for, exact cache hits, deadlines, and a whole study's files, without vLLM."""

from __future__ import annotations

import asyncio
import math
import sys

import pytest

from prefixstudy.config import load_config
from prefixstudy.results import load
from prefixstudy.runner import ModeSession
from prefixstudy.study.orchestrate import run_study
from prefixstudy.workloads import load_rows

ECHO = {"engine": {"kind": "echo", "block_size": 16}, "executor": "local", "arrivals.process": "constant",
        "dataset.prefix_len": 40, "dataset.suffix_len": 8, "dataset.output_len": 4,
        "sweep.num_requests": 6, "sweep.warmup_requests": 1, "sweep.rates": [50]}


def cfg_with(**sets):
    return load_config(None, {**ECHO, **sets})


def run_point(cfg, mode, rate):
    async def go():
        async with ModeSession(cfg, mode, load_rows(cfg)) as s:
            return await s.run_point(rate)

    return asyncio.run(go())


def test_on_point_hits_the_block_aligned_prefix_exactly():
    res = run_point(cfg_with(), "on", 50.0)
    req = res.requests
    m = req[~req["warmup"]]
    assert (len(req), len(m), res.meta["status"], res.meta["n_sent"], res.meta["block_size"]) == (7, 6, "ok", 6, 16)
    assert m["request_index"].tolist() == [0, 1, 2, 3, 4, 5]
    assert m["num_cached_tokens"].tolist() == [32] * 6 == m["expected_cached_tokens"].tolist()
    assert m["output_tokens"].tolist() == [4] * 6 and m["error"].tolist() == [""] * 6
    assert m["scheduled_s"].tolist() == pytest.approx([0.0, 0.02, 0.04, 0.06, 0.08, 0.1])
    # One echo sample per measured request: 48-token prompts, 32 of them served from the cache.
    it = res.iterations
    assert (len(it), it["prefix_hits"].tolist(), it["prompt_tokens"].tolist()) == (6, [32] * 6, [16] * 6)


def test_off_point_never_hits_and_expects_nothing():
    m = run_point(cfg_with(), "off", 50.0).requests.query("~warmup")
    assert m["num_cached_tokens"].tolist() == [0] * 6 == m["expected_cached_tokens"].tolist()


def test_unprimed_on_misses_once_per_group_then_hits():
    cfg = cfg_with(**{"sweep.prime_prefixes": False, "sweep.warmup_requests": 0, "dataset.groups": 2})
    m = run_point(cfg, "on", 50.0).requests
    assert m["num_cached_tokens"].tolist() == [0, 0, 32, 32, 32, 32] == m["expected_cached_tokens"].tolist()


def test_requests_open_at_the_point_deadline_are_rows_marked_unfinished():
    # Every token takes 10 s and the point is capped at 1 s: both requests are cut, neither dropped.
    cfg = cfg_with(**{"engine.decode_ms_per_token": 10_000, "sweep.num_requests": 2, "sweep.warmup_requests": 0,
                      "sweep.prime_prefixes": False, "sweep.max_point_duration_s": 1.0})
    res = run_point(cfg, "on", 4.0)
    assert res.requests["error"].tolist() == ["unfinished: cancelled at max_point_duration_s"] * 2
    assert res.requests["output_tokens"].tolist() == [1, 1]  # the first token came at once
    assert 1.0 <= res.meta["duration_s"] < 2.0


@pytest.mark.slow
def test_a_study_on_the_echo_backend_writes_every_file(tmp_path):
    run = run_study(cfg_with(**{"out": str(tmp_path), "sweep.rates": [25, 50]}), progress=False)
    res = load(run)
    assert (res.manifest["status"], res.manifest["engine"], res.manifest["executor"]) == ("complete", "echo", "local")
    assert [(p["mode"], p["rate"], p["status"], p["accounting_ok"]) for p in res.manifest["points"]] == [
        ("on", 25.0, "ok", True), ("off", 25.0, "ok", True), ("off", 50.0, "ok", True), ("on", 50.0, "ok", True)]
    s = res.summary
    assert s["mode"].tolist() == ["on", "on", "off", "off"] and s["n_ok"].tolist() == [6] * 4
    assert s["hit_rate_measured"].tolist() == [32 / 48, 32 / 48, 0.0, 0.0] == s["hit_rate_expected"].tolist()
    assert s["hit_rate_ok"].tolist() == [True] * 4 and not math.isnan(s["mean_e2e_ms"].iloc[0])
    assert len(res.requests) == 4 * 7 and len(res.iterations) == 4 * 6


def test_run_study_takes_its_folders_as_str(tmp_path):
    # From a script a folder is often a str: the run goes there, and a resume given as a str finds it.
    run = run_study(cfg_with(), str(tmp_path / "run"), progress=False)
    assert run == tmp_path / "run" and load(run).summary["n_ok"].tolist() == [6, 6]
    assert run_study(None, progress=False, resume=str(run)) == run
    assert load(run).manifest["status"] == "complete"


def test_failed_engine_point_is_a_row_and_the_sweep_goes_on(tmp_path, monkeypatch):
    from prefixstudy.engines.echo import EchoEngine

    async def refuse(self):
        if self.mode == "on" and not getattr(self, "refused", False):
            self.refused = True
            raise RuntimeError("engine refused to reset its prefix cache")
        self.cache.clear()

    monkeypatch.setattr(EchoEngine, "reset_prefix_cache", refuse)
    res = load(run_study(cfg_with(**{"out": str(tmp_path), "sweep.rates": [25, 50], "sweep.modes": ["on"]}),
                         progress=False))
    assert [(p["rate"], p["status"], p["error"]) for p in res.manifest["points"]] == [
        (25.0, "failed", "RuntimeError: engine refused to reset its prefix cache"), (50.0, "ok", "")]
    assert res.manifest["status"] == "complete_with_failures"
    assert res.summary["status"].tolist() == ["failed", "ok"]


def test_warmups_share_the_group_prefix_but_no_measured_suffix():
    from prefixstudy.config import load_config
    from prefixstudy.workloads.fixed import make_dataset
    from prefixstudy.runner import ModeSession, warmup_rows

    rows = make_dataset(4, prefix_len=20, suffix_len=4, output_len=3, groups=2)
    session = ModeSession(load_config(None), "on", rows)
    warm = warmup_rows(rows, session.prefixes, 3, session.token_range)
    assert [(w.group, len(w.prompt_token_ids)) for w in warm] == [(0, 24), (1, 24), (0, 24)]
    assert all(w.prompt_token_ids[:20] == rows[w.group].prompt_token_ids[:20] for w in warm)
    measured = {tuple(r.prompt_token_ids[20:]) for r in rows}
    assert not {tuple(w.prompt_token_ids[20:]) for w in warm} & measured


class _Node:
    """An object in a reference cycle with itself: only the collector can free it."""

    def __init__(self):
        self.self = self


def test_settle_heap_frees_cyclic_garbage_and_freezes_the_rest(monkeypatch):
    """Before each point: garbage from the last one is collected, what lives is frozen, so no full
    collection over the process heap (414 ms measured) can fall inside a measured point.  The first
    call is a full collection: it frees a cycle that was frozen while still referenced."""
    import gc
    import weakref

    from prefixstudy.runner import pacing

    monkeypatch.setattr(pacing, "_after_full", [None])
    monkeypatch.setattr(pacing, "_frozen_since", [0])
    keep, lost = _Node(), _Node()
    gc.collect()
    gc.freeze()  # as the previous point left it: `lost` is frozen while still referenced
    lost_ref = weakref.ref(lost)
    del lost
    switch = sys.getswitchinterval()
    try:
        # No other thread of this process (xdist's channel, one a test left) may allocate between the
        # call's count and its freeze: that object would be frozen uncounted.  The call releases the
        # GIL to none of them before the switch interval ends.
        sys.setswitchinterval(60)
        try:
            pacing.settle_heap()
        finally:
            sys.setswitchinterval(switch)
        assert lost_ref() is None  # unfrozen, collected
        assert all(o is not keep for o in gc.get_objects())  # frozen: no collection scans it
        # the interpreter, pandas, pytest: all frozen with it, and counted as the full collection's
        # mark (frozen objects freed since, by any thread, only lower the count)
        assert pacing._after_full[0] >= gc.get_freeze_count() > 10_000
    finally:
        gc.unfreeze()


def test_settle_heap_collects_what_came_since_the_last_freeze_and_all_once_the_heap_grows_by_a_quarter(monkeypatch):
    """Between full collections a call walks only the objects allocated since the last freeze (a
    point's own), so a young cycle goes and a frozen one waits; once the frozen objects are a quarter
    more than the last full collection left, the next call is full again and frees it."""
    import gc
    import weakref

    from prefixstudy.runner import pacing

    monkeypatch.setattr(pacing, "_after_full", [None])
    monkeypatch.setattr(pacing, "_frozen_since", [0])
    try:
        pacing.settle_heap()  # full: sets the mark
        mark = pacing._after_full[0]
        old = _Node()
        pacing.settle_heap()  # `old` is frozen now, still referenced
        assert pacing._after_full[0] == mark  # not a full collection
        young = _Node()
        old_ref, young_ref = weakref.ref(old), weakref.ref(young)
        del old, young
        pacing.settle_heap()
        assert young_ref() is None and old_ref() is not None  # the frozen cycle waits for a full collection
        assert pacing._after_full[0] == mark
        grown = [[] for _ in range(mark // 4 + 10_000)]  # a quarter more live objects than the mark, and some
        pacing.settle_heap()  # they are frozen here (the count has not grown yet at the check)
        assert old_ref() is not None
        pacing.settle_heap()  # now it has: full
        assert old_ref() is None and pacing._after_full[0] >= mark + len(grown) - 10_000  # they count in the mark
    finally:
        gc.unfreeze()


def test_after_other_code_unfreezes_the_heap_the_next_call_counts_it_all_and_the_one_after_is_full(monkeypatch):
    """settle_heap counts what it freezes instead of asking the interpreter, whose count walks every
    frozen object.  Code that unfreezes the heap (the simulator does, as it ends) makes every object
    young: the next call walks them all, frees the garbage among them, and counts them as frozen
    since the mark, which is more than a quarter of it, so the call after is a full collection."""
    import gc
    import weakref

    from prefixstudy.runner import pacing

    monkeypatch.setattr(pacing, "_after_full", [None])
    monkeypatch.setattr(pacing, "_frozen_since", [0])
    try:
        pacing.settle_heap()
        mark = pacing._after_full[0]
        old = _Node()
        pacing.settle_heap()
        small = pacing._frozen_since[0]
        assert 0 < small < mark / 4  # a few objects: `old` and what the calls left
        gc.unfreeze()  # other code
        old_ref = weakref.ref(old)
        del old
        pacing.settle_heap()
        assert old_ref() is None  # the walk over the whole heap freed the cycle frozen before
        assert pacing._after_full[0] == mark and pacing._frozen_since[0] > small + mark * 3 / 4
        pacing.settle_heap()
        assert pacing._frozen_since[0] == 0 and pacing._after_full[0] > mark / 2  # full: a new mark
    finally:
        gc.unfreeze()


@pytest.mark.slow
def test_every_file_of_a_run_and_its_report_is_readable_by_all_under_the_default_umask(tmp_path):
    import os
    import stat

    from prefixstudy.report import build_report

    old = os.umask(0o022)
    try:
        run = run_study(cfg_with(**{"out": str(tmp_path)}), progress=False)
        build_report(run)
    finally:
        os.umask(old)
    files = [p for p in run.rglob("*") if p.is_file()]
    assert {"report.html", "report.md", "summary.csv", "manifest.json", "on-50.parquet"} <= {p.name for p in files}
    assert any(p.suffix == ".png" for p in files) and any(p.suffix == ".svg" for p in files)
    assert {p.relative_to(run).as_posix(): oct(stat.S_IMODE(p.stat().st_mode)) for p in files
            if stat.S_IMODE(p.stat().st_mode) != 0o644} == {}


def test_itl_summary_pools_every_gap_as_vllm_bench_does():
    import numpy as np

    from prefixstudy.runner import itl_summary

    out = itl_summary([np.array([1.0, 2.0]), np.array([3.0]), np.array([])], [50, 99.9])
    assert out == pytest.approx({"median": 2.0, "std": math.sqrt(2 / 3), "p50": 2.0, "p99.9": 2.998})
    assert itl_summary([], [50]) == {}


def test_percentile_is_numpys_to_the_bit():
    """The record's ITL p50 / p99 come from runner.percentile, which must equal np.percentile's
    default (linear) method exactly: on gaps like a request's (sums of clock differences, ties,
    one gap, constant gaps) and on plain random arrays."""
    import numpy as np

    from prefixstudy.runner import percentile

    rng = np.random.default_rng(7)
    checked = 0
    for _ in range(1000):
        n = int(rng.integers(1, 300))
        a = rng.random(n) * rng.choice([1e-3, 1.0, 5.09, 37.1, 1e3])
        if rng.random() < 0.3:
            a = np.round(a, int(rng.integers(0, 3)))  # ties
        if rng.random() < 0.1:
            a = np.full(n, 5.0897)
        for gaps in (a, np.diff(np.cumsum(a)) * 1e3):
            if len(gaps):
                ordered = sorted(gaps.tolist())
                for q in (0, 1, 50, 90, 99, 99.9, 100):
                    assert percentile(ordered, q) == float(np.percentile(gaps, q))
                    checked += 1
    assert checked > 10_000
    assert percentile([2.0], 99) == 2.0 and percentile([1.0, 3.0], 50) == 2.0 and percentile([1.0, 3.0], 99) == 2.98


def test_every_point_records_its_itl_spread():
    res = run_point(cfg_with(**{"engine.decode_ms_per_token": 2.0}), "on", 50.0)
    itl = res.meta["itl_ms"]
    assert set(itl) == {"median", "std", "p50", "p90", "p99"}
    assert 2.0 <= itl["p50"] <= itl["p99"] < 50  # 3 gaps of ~2 ms per request (4 tokens)


def test_a_long_wait_for_a_send_naps_briefly_so_a_timer_that_runs_slow_cannot_make_it_late(monkeypatch):
    """A clock where every timer sleep oversleeps by 0.5 % (a Ray actor's uvloop on this VM: 4.5 s
    slept 22 ms long).  A 4.5-s gap before a send must still end on time: no nap is longer than
    MAX_NAP_S, and the spin covers the rest."""
    from prefixstudy.runner import pacing

    now = [100.0]
    naps = []

    async def slow_sleep(d):
        naps.append(d)
        now[0] += d * 1.005 if d > 0 else 1e-6

    monkeypatch.setattr(pacing.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(pacing.asyncio, "sleep", slow_sleep)
    asyncio.get_event_loop_policy().new_event_loop().run_until_complete(pacing._sleep_until(104.5))
    timed = [d for d in naps if d > 0]
    assert max(timed) == pacing.MAX_NAP_S and len(timed) == 90
    assert 0 <= now[0] - 104.5 < 2e-6  # one sleep(0) past the target at most; one 4.5-s sleep: 22.5 ms


def test_an_engine_that_does_not_start_stops_the_study_with_one_line(tmp_path, monkeypatch):
    """Its first line is the reason; the run folder stays, marked failed.  Interleaved arms start
    every engine before the first point, so no point ran; one arm after another keeps ON's points."""
    import json

    from prefixstudy.engines.echo import EchoEngine
    from prefixstudy.errors import StudyFailed

    started = []

    async def start(self):
        started.append(self.mode)
        if self.mode == "off":
            raise ValueError("KV cache too small for max_model_len\nmore detail")

    monkeypatch.setattr(EchoEngine, "start", start)
    with pytest.raises(StudyFailed) as e:
        run_study(cfg_with(out=str(tmp_path)), progress=False)
    assert str(e.value) == ("cache OFF: the engine did not start (ValueError: KV cache too small for max_model_len); "
                            "-v shows the engine's own log")
    run, = (tmp_path / "default").iterdir()
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["status"] == "failed" and manifest["points"] == []
    assert manifest["error"] == str(e.value)  # the reason stays with the run
    assert started == ["on", "off"]
    with pytest.raises(StudyFailed):
        run_study(cfg_with(**{"out": str(tmp_path / "apart"), "sweep.interleave_arms": False}), progress=False)
    run, = (tmp_path / "apart" / "default").iterdir()
    assert [p["mode"] for p in json.loads((run / "manifest.json").read_text())["points"]] == ["on"]

