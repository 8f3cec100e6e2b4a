"""The simulator's committed accuracy (experiments/results/sim-accuracy/) is of the committed studies:
every measured point of each study it names, no point of a study that is gone, and its tables are
what its accuracy.csv gives (experiments/sim/accuracy.py).  A study re-run without re-running the
accuracy check fails here, as the replaced h200-tp1 once went unnoticed."""

from __future__ import annotations

import pandas as pd
import pytest

from tests.scripts import REPO, load_script

ACC = REPO / "experiments/results/sim-accuracy"


@pytest.fixture(scope="module")
def accuracy():
    return load_script("experiments/sim/accuracy.py")


def _points(df: pd.DataFrame) -> list[tuple]:
    return sorted((str(m), float(r), int(k)) for m, r, k in zip(df["mode"], df["rate"], df["repeat"], strict=True))


def test_every_check_covers_every_measured_point_of_its_study(accuracy):
    df = pd.read_csv(ACC / "accuracy.csv")
    checks = {"held-out point": sorted(accuracy.STUDIES),
              **{f"transfer from {src}": [dst] for src, dst in accuracy.TRANSFERS}}
    assert sorted(df["check"].unique()) == sorted(checks)
    for check, studies in checks.items():
        rows = df[df["check"] == check]
        assert sorted(rows["study"].unique()) == studies, check
        for study in studies:
            measured = pd.read_csv(REPO / accuracy.STUDIES[study] / "summary.csv")
            got = rows[rows["study"] == study]
            assert _points(got) == _points(measured), (check, study)
            m = measured.set_index(["mode", "rate", "repeat"])["mean_e2e_ms"]
            for _, r in got.iterrows():
                assert r["mean_e2e_ms_meas"] == pytest.approx(m[(r["mode"], r["rate"], r["repeat"])], rel=1e-12)


def test_the_tables_are_what_accuracy_csv_gives(accuracy, tmp_path):
    accuracy.write(pd.read_csv(ACC / "accuracy.csv"), tmp_path)
    for name in ("accuracy.md", "summary.md"):
        assert (tmp_path / name).read_text() == (ACC / name).read_text(), name


@pytest.fixture(scope="module")
def accuracy_async():
    return load_script("experiments/sim/accuracy_async.py")


def test_the_default_engine_table_covers_every_calibration_study_and_point(accuracy_async, monkeypatch):
    """async.csv holds every committed default-engine study with GPU-span steps, each of its points and
    repeats under both held-out checks and its other runs; with one row gone, or a measured value
    changed, the check says so."""
    monkeypatch.chdir(REPO)
    df = pd.read_csv(ACC / "async.csv")
    assert accuracy_async.calibrations() == ["h200-tp1", "h200-tp1-fixed-order"]
    assert accuracy_async.coverage_problems(df) == []
    dropped = df.drop(index=df.index[(df["check"] == "held-out repeat") & (df["study"] == "h200-tp1")][0])
    assert [p.split(":")[0] for p in accuracy_async.coverage_problems(dropped)] == ["held-out repeat h200-tp1"]
    changed = df.copy()
    changed.loc[changed.index[0], "mean_e2e_ms_meas"] *= 1.01
    r = changed.iloc[0]
    assert accuracy_async.coverage_problems(changed) == [
        f"{r['check']} {r['study']} {r['mode']} {r['rate']:g} r{r['repeat']}: measured E2E is not summary.csv's"]


def test_the_default_engine_tables_are_what_async_csv_gives(accuracy_async, tmp_path):
    accuracy_async.write(pd.read_csv(ACC / "async.csv"), tmp_path)
    for name in ("async.md", "async-summary.md"):
        assert (tmp_path / name).read_text() == (ACC / name).read_text(), name
