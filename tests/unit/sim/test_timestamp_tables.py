"""The committed comparison of the timestamp-only calibration with the step-record one
(experiments/results/sim-accuracy/timestamps*.md, experiments/sim/timestamps.py) covers every
measured point of each study it names with both calibrations, and its tables are what its
timestamps.csv gives."""

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
        assert set(df[df["study"] == study]["check"]) == set(script.calibrations_of(study)), study
        for calibration in script.calibrations_of(study):
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
    for name in ("timestamps.md", "timestamps-summary.md", "timestamps-verifiable.md"):
        assert (tmp_path / name).read_text() == (ACC / name).read_text(), name


def test_every_timestamp_fits_search_ended_before_its_cap():
    """A search stopped by the cap on simulations has not converged: none of the committed fits was."""
    from prefixstudy.sim.fit_requests import MAX_EVALS

    for csv in (ACC / "timestamps.csv", ACC / "timestamps-pipelined/timestamps.csv"):
        sims = pd.read_csv(csv)["fit_simulations"].dropna()
        assert len(sims) > 0 and sims.max() < MAX_EVALS, csv


def test_the_pipelined_variant_covers_the_studies_that_ran_pipelined(script, tmp_path):
    """sim-accuracy/timestamps-pipelined (timestamps.py --pipelined): the timestamp column of every
    study whose engine scheduled step N+1 while step N ran, every measured point of each; its
    tables are what its CSV gives."""
    var_dir = ACC / "timestamps-pipelined"
    variant = pd.read_csv(var_dir / "timestamps.csv")
    want = [n for n, d in script.STUDIES.items() if script.ran_pipelined(REPO / d)]
    assert want == ["h200-vllm-server", "h100-vllm-server", "h100-tp1", "h100-tp1-spans"]
    assert sorted(variant["study"].unique()) == sorted(want) and set(variant["check"]) == {"timestamps"}
    for study in want:
        measured = pd.read_csv(REPO / script.STUDIES[study] / "summary.csv")
        assert _points(variant[variant["study"] == study]) == _points(measured), study
    script.write(variant, tmp_path)
    for name in ("timestamps.md", "timestamps-summary.md", "timestamps-verifiable.md"):
        assert (tmp_path / name).read_text() == (var_dir / name).read_text(), name
