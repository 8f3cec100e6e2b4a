"""The roofline transfer between GPU kinds on vLLM's default engine (experiments/sim/gpu_transfer.py):
its CSV covers every measured point of both targets under each check, its table is what the CSV
gives, and the CSV is what the code gives at one point."""

from __future__ import annotations

from dataclasses import replace

import pandas as pd
import pytest

from tests.scripts import REPO, load_script

ACC = REPO / "experiments/results/sim-accuracy"


@pytest.fixture(scope="module")
def script():
    return load_script("experiments/sim/gpu_transfer.py")  # it finds accuracy_async beside it itself


def test_every_measured_point_of_each_target_is_simulated_under_each_check(script):
    df = pd.read_csv(ACC / "gpu-transfer.csv")
    for src, dst in script.PAIRS:
        measured = pd.read_csv(REPO / "experiments/results" / dst / "summary.csv").set_index(["mode", "rate", "repeat"])
        for suffix in ("", script.UNCHANGED, script.OWN_HOST):
            rows = df[(df["check"] == f"transfer from {src}{suffix}") & (df["study"] == dst)]
            rows = rows.set_index(["mode", "rate", "repeat"])
            assert sorted(rows.index) == sorted(measured.index)
            assert (rows["mean_e2e_ms_meas"] - measured["mean_e2e_ms"].reindex(rows.index)).abs().max() < 1e-9


def test_its_table_is_what_its_csv_gives(script, tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    script.write(pd.read_csv(ACC / "gpu-transfer.csv"), tmp_path)
    assert (tmp_path / "gpu-transfer.md").read_text() == (ACC / "gpu-transfer.md").read_text()


@pytest.mark.slow
def test_the_csv_is_what_the_code_gives_at_on_1_on_the_h100(script, monkeypatch):
    """h200-tp1's fit carried to the H100, re-simulated at ON 1 req/s (three repeats): the committed
    numbers.  The same model with its host's fixed cost 1 % higher is the wrong data it must refuse."""
    monkeypatch.chdir(REPO)
    _, model, _ = script.carried("h200-tp1", "h100-tp1-spans")
    committed = pd.read_csv(ACC / "gpu-transfer.csv").query(
        "check == 'transfer from h200-tp1' and study == 'h100-tp1-spans' and mode == 'on' and rate == 1")
    want = committed.set_index("repeat")["mean_e2e_ms_sim"].sort_index()

    def simulated(m):
        rows = script.accuracy_async.simulate_points(script.RESULTS / "h100-tp1-spans", lambda mode, rate: m, "x",
                                                     points={("on", 1.0)})
        return pd.Series({r["repeat"]: r["mean_e2e_ms_sim"] for r in rows}).sort_index()

    assert len(want) == 3
    pd.testing.assert_series_equal(simulated(model), want, check_names=False, rtol=1e-9, obj=(
        "gpu-transfer.csv against the code: re-run experiments/sim/gpu_transfer.py"))
    wrong = replace(model, host={**model.host, "c0_ms": model.host["c0_ms"] * 1.01})
    assert not simulated(wrong).round(6).equals(want.round(6))

