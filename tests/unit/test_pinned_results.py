"""What a study writes stays what it was: the seed's simulated sweep and the try-echo study give
the summary.csv recorded in tests/fixtures/pinned, which the code before the one sweep loop
(``sweep.run_sweep``) wrote.  The simulated one is compared whole (virtual time is deterministic); the
echo study runs on the wall clock, so only the columns the schedule and the cache decide are."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from tests import forkcli

REPO = Path(__file__).resolve().parents[2]
PINNED = REPO / "tests/fixtures/pinned"
# The try-echo columns that no clock moves: counts, the arrival schedule, hit rates, cached tokens.
ECHO_FIXED = ["mode", "rate", "repeat", "status", "n_sent", "n_ok", "n_failed", "n_unfinished", "arrival_rate",
              "hit_rate_measured", "hit_rate_expected", "hit_rate_estimated", "hit_rate_ok", "cached_tokens_gpu",
              "step_timing", "busy_steps"]


def cli(*args):
    return forkcli.run(args, cwd=REPO, timeout=300)


def _summary(stdout: str) -> pd.DataFrame:
    run = next(line.removeprefix("results: ") for line in stdout.splitlines() if line.startswith("results: "))
    return pd.read_csv(Path(run) / "summary.csv")


@pytest.mark.slow
def test_the_seed_sweep_simulates_to_the_pinned_summary_and_leaves_the_console_quiet(tmp_path):
    """In worker processes (``--jobs 2``), in a process of its own: its stderr is read to the end,
    and the end is when the last process holding it exits, the workers' fork server included.  So
    what the fork server prints as it exits after the command (nanobind's "leaked" report of a heap
    left frozen) is caught."""
    r = subprocess.run([sys.executable, "-m", "prefixstudy", "simulate", "seed-a100x8-tp8", "--calibration",
                        REPO / "experiments/results/h200-tp1-sync", "--gpu", "A100-SXM4-40GB", "--tp", "8",
                        "--rates", "8,32", "--jobs", "2", "--out", tmp_path, "--no-report"],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    assert (r.returncode, r.stderr) == (0, "")
    pd.testing.assert_frame_equal(_summary(r.stdout), pd.read_csv(PINNED / "seed-a100x8-tp8_rates-8-32_summary.csv"))


@pytest.mark.slow
def test_the_try_echo_study_gives_the_pinned_counts_and_hit_rates(tmp_path):
    r = cli("run", "try-echo", "--out", tmp_path, "--quiet", "--no-report")
    assert r.returncode == 0, r.stderr
    pd.testing.assert_frame_equal(_summary(r.stdout)[ECHO_FIXED], pd.read_csv(PINNED / "try-echo_summary.csv")[ECHO_FIXED])
