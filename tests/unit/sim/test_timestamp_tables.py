"""The committed comparison of the timestamp-only calibration with the step-record one
(experiments/results/sim-accuracy/timestamps*.md, experiments/sim/timestamps.py) covers every
measured point of each study it names with both calibrations, its tables are what its
timestamps.csv gives, and docs/simulator.md states what the table says."""

from __future__ import annotations

import pandas as pd
import pytest

from tests.scripts import REPO, load_script

ACC = REPO / "experiments/results/sim-accuracy"


@pytest.fixture(scope="module")
def script():
    return load_script("experiments/sim/timestamps.py")


def _points(df: pd.DataFrame) -> list[tuple]:
    return sorted((str(m), float(r), int(k)) for m, r, k in zip(df["mode"], df["rate"], df["repeat"], strict=True))


def test_both_calibrations_cover_every_measured_point_of_each_study(script):
    df = pd.read_csv(ACC / "timestamps.csv")
    assert sorted(df["study"].unique()) == sorted(script.STUDIES)
    for study, d in script.STUDIES.items():
        measured = pd.read_csv(REPO / d / "summary.csv")
        m = measured.set_index(["mode", "rate", "repeat"])["mean_e2e_ms"]
        for calibration in script.CALIBRATIONS:
            got = df[(df["study"] == study) & (df["check"] == calibration)]
            assert _points(got) == _points(measured), (study, calibration)
            for _, r in got.iterrows():
                assert r["mean_e2e_ms_meas"] == pytest.approx(m[(r["mode"], r["rate"], r["repeat"])], rel=1e-12)


def test_the_timestamp_fits_never_read_step_records(script):
    """Every timestamp-only row was priced by a fit to request timestamps (its simulations counted)."""
    df = pd.read_csv(ACC / "timestamps.csv")
    ts = df[df["check"] == "timestamps"]
    assert (ts["fit_simulations"] > 0).all() and df[df["check"] == "step records"]["fit_simulations"].isna().all()


def test_the_tables_are_what_timestamps_csv_gives(script, tmp_path):
    script.write(pd.read_csv(ACC / "timestamps.csv"), tmp_path)
    for name in ("timestamps.md", "timestamps-summary.md"):
        assert (tmp_path / name).read_text() == (ACC / name).read_text(), name


def test_the_docs_state_what_the_table_says(script):
    text = " ".join((REPO / "docs/simulator.md").read_text().split())
    assert '--8<-- "experiments/results/sim-accuracy/timestamps-summary.md"' in text
    for claim in script.claims(script.per_point(pd.read_csv(ACC / "timestamps.csv"))):
        assert claim in text, claim
