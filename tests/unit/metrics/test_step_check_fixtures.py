"""The step-timing invariants on committed records: the host stamps of vLLM's async engine
(h200-tp1-async) fail them, the same engine's GPU spans (its gpu-spans trace, and h200-tp1, timed on
the GPU, on H200s and on an H100) pass, and ``prefixstudy check`` says so with its exit status."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from prefixstudy.metrics import step_checks
from prefixstudy.costmodel import engine_fit
from prefixstudy.schema import typed_iterations
from tests.scripts import load_script

REPO = Path(__file__).resolve().parents[3]
RESULTS = REPO / "experiments" / "results"


def _iterations(study: str) -> pd.DataFrame:
    return typed_iterations(pd.read_parquet(RESULTS / study / "iterations.parquet"))


def _checks(it: pd.DataFrame) -> dict:
    fit = engine_fit.fit_step_cost(it, n_boot=0) if len(engine_fit.busy_steps(it)) else None
    return step_checks.check_steps(it, fit.coef if fit is not None else None)


def _counts(c: dict) -> dict:
    return {m: (v["n"], v["shorter"], v["ok"]) for m, v in c.items()}


def test_the_async_engines_host_stamps_fail_the_pairwise_check():
    c = _checks(_iterations("h200-tp1-async"))
    # most prompt steps look shorter than the decode-only step before them: their GPU work ran under it
    assert _counts(c["pairwise"]) == {"off": (267, 156, False), "on": (375, 326, False)}
    assert c["ok"] is False and c["window_agreement"]["ok"] is None  # no fit of engine-async rows


def test_the_same_engines_gpu_spans_pass_it():
    tc = load_script("experiments/gpu/timing_check.py")
    for mode, pairs, host_shorter in (("on", 187, 169), ("off", 113, 71)):
        rows = step_checks.engine_rows(typed_iterations(
            tc.trace_rows(str(RESULTS / f"h200-tp1-async/gpu-spans/step-trace-{mode}.gz"), mode)))
        assert _counts(step_checks.pairwise(rows)) == {mode: (pairs, 0, True)}
        assert _counts(step_checks.pairwise(rows, "host_step_ms")) == {mode: (pairs, host_shorter, False)}


@pytest.mark.parametrize("study, off, on", [
    ("h200-tp1", (459, 0, 275), (1912, 15, 1369)),  # pairs, shorter by GPU span, shorter by host stamps
    ("h200-tp1-fixed-order", (471, 0, 275), (2769, 21, 1909)),
    ("h100-tp1-spans", (1072, 0, 609), (2615, 39, 1993)),
])
def test_the_headline_studies_timed_on_the_gpu_pass_every_check_and_their_host_stamps_would_not(study, off, on):
    it = _iterations(study)
    assert set(it["timing"]) == {"gpu-span"}
    c = _checks(it)
    assert _counts(c["pairwise"]) == {"off": (off[0], off[1], True), "on": (on[0], on[1], True)}
    assert _counts(c["pairwise_host"]) == {"off": (off[0], off[2], False), "on": (on[0], on[2], False)}
    assert all(m["ok"] for m in c["prefill_not_faster"].values()) and c["window_agreement"]["ok"]
    assert {m: v["ok"] for m, v in c["busy_time"].items()} == {"off": True, "on": True}
    assert c["ok"] is True


def test_spans_that_count_the_previous_steps_work_again_break_the_busy_time():
    it = _iterations("h200-tp1")
    it = it[(it["mode"] == "on") & (it["rate"] == 16.0) & (it["repeat"] == 0)].sort_values("t_s")
    wrong = it.assign(step_ms=it["step_ms"] + it["step_ms"].shift(1, fill_value=0.0))  # from the previous start
    right, bad = step_checks.busy_time(it)["on"], step_checks.busy_time(wrong)["on"]
    assert right["ok"] and right["worst"] < 1.0
    assert not bad["ok"] and bad["worst"] > 1.5


def test_prefixstudy_check_exits_1_on_a_violation_and_0_when_every_check_passes():
    def check(study):
        return subprocess.run([sys.executable, "-m", "prefixstudy", "check", str(RESULTS / study)],
                              capture_output=True, text=True, cwd=REPO)

    bad, good = check("h200-tp1-async"), check("h200-tp1")
    assert bad.returncode == 1 and bad.stdout.splitlines()[0].endswith("h200-tp1-async: FAILED")
    assert "FAILS: 326 of 375 pairs shorter beyond noise" in bad.stdout
    assert good.returncode == 0 and good.stdout.splitlines()[0].endswith("h200-tp1: ok") and "FAILS" not in good.stdout
    missing = check("nope")
    assert (missing.returncode, missing.stderr) == (2, f"error: {RESULTS / 'nope'}: results folder not found\n")


def test_the_headline_studys_dispatch_lag_is_as_the_results_readme_says():
    """experiments/results/README.md: p99 over 1 ms at 3 of the 28 points, all in repeat 2."""
    s = pd.read_csv(RESULTS / "h200-tp1/summary.csv")
    late = s[s["dispatch_lag_p99_ms"] > 1.0]
    assert len(s) == 28
    assert sorted(zip(late["mode"], late["rate"], late["repeat"], late["saturated"], strict=True)) == [
        ("off", 56.0, 1, True), ("on", 32.0, 1, False), ("on", 96.0, 1, True)]
