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
