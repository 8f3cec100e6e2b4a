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


def test_the_verifiable_sentences_are_timestamps_csv_s(script):
    """docs/simulator.md's paragraph on where the repeats can check the 10 % goal quotes timestamps.csv."""
    df = pd.read_csv(ACC / "timestamps.csv")
    pp = script.per_point(df).merge(script.accuracy.measured_half_width(df), on=["check", "study", "mode", "rate"])
    u = pp[pp["saturated_meas_share"] <= 0.5]
    e, ci = u["mean_e2e_ms_err"].abs(), u["e2e_meas_ci"]
    known = ci <= 0.10
    by = {c: (int((u["check"] == c).sum()), int((known & (u["check"] == c)).sum()),
              int((known & (e <= 0.10) & (u["check"] == c)).sum()), int((((e <= 0.10) | (e <= ci)) & (u["check"] == c)).sum()))
          for c in script.CALIBRATIONS}
    assert by == {"step records": (61, 23, 23, 61), "timestamps": (61, 23, 22, 57)}
    assert int((u[u["check"] == "timestamps"]["n_repeats"] == 1).sum()) == 22
    (miss,) = u[known & (e > 0.10)].itertuples()
    text = " ".join((REPO / "docs/simulator.md").read_text().split())
    assert (f"The timestamp fit's one miss there is {miss.mode.upper()} {miss.rate:g} on {miss.study} "
            f"(+{miss.mean_e2e_ms_err * 100:.1f} %, its measured mean known to ±{miss.e2e_meas_ci * 100:.1f} %)") in text
    assert "22 of these points ran once" in text and "at 23 of the 61 unsaturated points" in text
    assert "57 of 61 points pass from timestamps and 61 from step records" in text


def test_the_docs_state_what_the_table_says(script):
    text = " ".join((REPO / "docs/simulator.md").read_text().split())
    assert '--8<-- "experiments/results/sim-accuracy/timestamps-summary.md"' in text
    for claim in script.claims(script.per_point(pd.read_csv(ACC / "timestamps.csv"))):
        assert claim in text, claim


def test_on_the_h100_studies_the_docs_name_the_points_outside_10_and_the_fit_that_ends_apart(script):
    """docs/simulator.md's words on the three H100 studies: which held-out points are outside 10 %, by
    each calibration, that every search ended on its own, and the fit without OFF 24 that ends apart."""
    from prefixstudy.sim.fit_requests import MAX_EVALS

    df = pd.read_csv(ACC / "timestamps.csv")
    pp = script.per_point(df)

    def outside(study, check="timestamps", by=0.10):
        h = pp[(pp["study"] == study) & (pp["check"] == check) & (pp["saturated_meas_share"] <= 0.5)]
        h = h.set_index(["mode", "rate"])
        return h[h["mean_e2e_ms_err"].abs() > by]["mean_e2e_ms_err"].round(3).to_dict()

    assert outside("h100-vllm-server") == {("on", 32.0): 0.114}
    assert outside("h100-tp1") == {("on", 48.0): 0.308}
    assert outside("h100-tp1-spans") == {("on", 48.0): 0.153}
    assert outside("h100-vllm-server", "step records") == {("on", 32.0): -0.127}
    assert outside("h100-tp1", "step records") == {} and outside("h100-tp1", "step records", 0.0)[("on", 48.0)] == 0.082
    assert outside("h100-tp1-spans", "step records") == {} and \
        outside("h100-tp1-spans", "step records", 0.0)[("on", 48.0)] == -0.045
    spans = pp[(pp["study"] == "h100-tp1-spans") & (pp["saturated_meas_share"] <= 0.5)]
    assert {c: (int((g["mean_e2e_ms_err"].abs() <= 0.05).sum()), round(g["mean_e2e_ms_err"].abs().mean(), 3))
            for c, g in spans.groupby("check")} == {"step records": (10, 0.02), "timestamps": (8, 0.037)}
    sims = df["fit_simulations"].dropna()
    assert (int(sims.min()), int(sims.max())) == (50, 173) and sims.max() < MAX_EVALS == 200
    fits = df[(df["study"] == "h100-vllm-server") & (df["check"] == "timestamps")]
    fits = fits.drop_duplicates(["mode", "rate"]).set_index(["mode", "rate"])
    apart = fits.loc[("off", 24.0)]
    assert (round(apart["coef_decode_tokens"], 3), round(apart["fit_e2e_mean_abs_err"], 3)) == (0.066, 0.008)
    rest = fits.drop(("off", 24.0))
    assert (round(rest["coef_decode_tokens"].min(), 3), round(rest["coef_decode_tokens"].max(), 3)) == (0.077, 0.095)
    assert (round(rest["fit_e2e_mean_abs_err"].min(), 3), round(rest["fit_e2e_mean_abs_err"].max(), 3)) == (0.022, 0.035)
    assert round(apart["c0_ms"], 2) == 6.23 and (round(rest["c0_ms"].min(), 2), round(rest["c0_ms"].max(), 2)) == (5.90, 6.09)
    text = " ".join((REPO / "docs/simulator.md").read_text().split())
    mean = {st: g[(g["check"] == "timestamps") & (g["saturated_meas_share"] <= 0.5)]["mean_e2e_ms_err"].abs().mean()
            for st, g in pp.groupby("study")}
    assert (f"Its mean absolute error over the unsaturated points is {mean['h200-tp2']:.1%} on h200-tp2, "
            f"{mean['h200-vllm-server']:.1%} on h200-vllm-server, {mean['h100-vllm-server']:.1%} on h100-vllm-server, "
            f"{mean['h100-tp1']:.1%} on h100-tp1, {mean['h100-tp1-spans']:.1%} on h100-tp1-spans and "
            f"{mean['h200-tp1']:.1%} on h200-tp1").replace("%", " %") in text
    for words in ("outside is ON 32 (+11.4 %), the highest ON rate. From h100-tp1-spans' step records it is −12.7 %.",
                  "ON 48 (+30.8 %), the highest ON rate, and from h100-tp1-spans' step records +8.2 %.",
                  "is outside from timestamps (+15.3 %; step records −4.5 %). The step records are the closer: "
                  "within 5 % at 10 of 10 points against 8, mean |error| 2.0 % against 3.7 %.",
                  "after 50 to 173 simulations",
                  "0.066 ms per decode token and 0.8 % mean absolute E2E error on its own points, against "
                  "0.077–0.095 ms and 2.2–3.5 %, and the highest fixed cost per step (6.23 ms against 5.90–6.09)"):
        assert words in text, words


def test_the_pipelined_variant_covers_the_studies_that_ran_pipelined_and_the_docs_quote_it(script, tmp_path):
    """sim-accuracy/timestamps-pipelined (timestamps.py --pipelined): the timestamp column of every
    study whose engine scheduled step N+1 while step N ran, every measured point of each; its
    tables are what its CSV gives; docs/simulator.md states each study's comparison with the
    shipped fit as the two CSVs give it."""
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
    doc = " ".join((REPO / "docs/simulator.md").read_text().split())
    shipped = pd.read_csv(ACC / "timestamps.csv")
    for sentence in script.pipelined_claims(shipped, variant):
        assert sentence in doc, sentence

    def mean_abs(df: pd.DataFrame, study: str) -> float:
        pp = script.per_point(df[(df["study"] == study) & (df["check"] == "timestamps")])
        return float(pp[pp["saturated_meas_share"] <= 0.5]["mean_e2e_ms_err"].abs().mean())

    # "further ... on three of the four, both `vllm serve` runs among them"; h100-tp1 the exception
    worse = {s for s in want if mean_abs(variant, s) > mean_abs(shipped, s)}
    assert worse == {"h200-vllm-server", "h100-vllm-server", "h100-tp1-spans"}
    assert "further from the measurements than the shipped fit on three of the four, both `vllm serve` runs" in doc

    def worst(df: pd.DataFrame, study: str) -> tuple[str, float, float]:
        pp = script.per_point(df[(df["study"] == study) & (df["check"] == "timestamps")])
        u = pp[pp["saturated_meas_share"] <= 0.5]
        w = u.loc[u["mean_e2e_ms_err"].abs().idxmax()]
        return w["mode"], w["rate"], w["mean_e2e_ms_err"]

    (mv, rv, ev), (ms, rs, es) = worst(variant, "h100-tp1"), worst(shipped, "h100-tp1")
    assert (mv, rv) == (ms, rs)
    assert (f"its worst point {mv.upper()} {rv:g} {script._pct(ev)} against {script._pct(es)}.") in doc
