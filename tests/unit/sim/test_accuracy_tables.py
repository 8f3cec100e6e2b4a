"""The simulator's committed accuracy (experiments/results/sim-accuracy/) is of the committed studies:
every measured point of each study it names, no point of a study that is gone, and its tables are
what its accuracy.csv gives (experiments/sim/accuracy.py).  A study re-run without re-running the
accuracy check fails here, as the replaced h200-tp1 once went unnoticed."""

from __future__ import annotations

import json

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


CANARY = {("on", 1.0), ("off", 16.0), ("off", 24.0)}


def _e2e_sim(rows: list[dict]) -> pd.Series:
    """simulate_points' rows as the simulated mean E2E by (mode, rate, repeat)."""
    return pd.DataFrame(rows).set_index(["mode", "rate", "repeat"])["mean_e2e_ms_sim"].sort_index()


@pytest.mark.slow
def test_the_table_is_what_the_code_gives_on_the_tp1_to_tp2_transfer(accuracy):
    """The tables above are checked against accuracy.csv; this checks accuracy.csv against the code on
    the one-step-at-a-time path (``costmodel.step_cost.fit`` without a host part, ``costmodel.transfer.transfer``):
    three of h200-tp2's points (ON at 1 req/s, OFF at 16 and at 24, the last before its knee)
    re-simulated from the fit on all of h200-tp1-sync, moved to TP 2 (virtual time: the same
    numbers).  The transferred model with its fixed cost 1 % higher is the wrong data the check must
    refuse, on ON's 1 req/s point."""
    src, dst = REPO / accuracy.STUDIES["h200-tp1"], REPO / accuracy.STUDIES["h200-tp2"]
    model = accuracy.transfer_model(src, dst)
    committed = pd.read_csv(ACC / "accuracy.csv").query("check == 'transfer from h200-tp1' and study == 'h200-tp2'")
    want = committed.set_index(["mode", "rate", "repeat"])["mean_e2e_ms_sim"].sort_index()
    want = want[[(m, r) in CANARY for m, r, _ in want.index]]

    def simulated(m, points=CANARY):
        return _e2e_sim(accuracy.simulate_points(dst, lambda mode, rate: m, "transfer from h200-tp1", points=points))

    assert len(want) == 3
    pd.testing.assert_series_equal(simulated(model), want, check_exact=False, rtol=1e-9, obj=(
        "accuracy.csv against the code: re-run experiments/sim/accuracy.py, timestamps.py and error_budget.py"))
    model.c0_ms *= 1.01
    wrong = simulated(model, points={("on", 1.0)})
    assert len(wrong) == 1 and wrong.iloc[0] > want.loc[("on", 1.0, 0)] * 1.005


@pytest.fixture(scope="module")
def accuracy_async():
    return load_script("experiments/sim/accuracy_async.py")


def test_the_default_engine_table_covers_every_calibration_study_and_point(accuracy_async, monkeypatch):
    """async.csv holds every committed default-engine study with GPU-span steps, each of its points and
    repeats under both held-out checks and its other runs; with one row gone, or a measured value
    changed, the check says so."""
    monkeypatch.chdir(REPO)
    df = pd.read_csv(ACC / "async.csv")
    assert accuracy_async.calibrations() == ["h100-tp1-spans", "h200-cache-pressure-spans",
                                             "h200-cache-pressure-spans-4400", "h200-multiturn-spans", "h200-tp1",
                                             "h200-tp1-fixed-order"]
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
    for name in ("async.md", "async-summary.md", "async-verifiable.md"):
        assert (tmp_path / name).read_text() == (ACC / name).read_text(), name


def test_a_point_s_measured_mean_is_known_to_its_t_interval(accuracy_async):
    """Repeats 90, 100, 110 ms: mean 100, standard deviation 10, so t(0.975, 2) = 4.303 times 10 / sqrt(3)
    either side, 24.8 %.  One repeat gives no interval.  A prediction 9 % off a mean known to 1 % is a
    miss the table counts; the same prediction is inside the interval of the widely spread repeats."""
    def rows(point, meas, sim):
        return [{"check": "held-out point", "study": "s", "mode": "on", "rate": point, "repeat": k,
                 "mean_e2e_ms_meas": m, "mean_e2e_ms_sim": sim, "saturated_meas": False, "saturated_sim": False,
                 **{c: 1.0 for c in ("p90_e2e_ms_meas", "p90_e2e_ms_sim", "mean_ttft_ms_meas", "mean_ttft_ms_sim",
                                     "mean_tpot_ms_meas", "mean_tpot_ms_sim", "hit_rate_measured_meas",
                                     "hit_rate_measured_sim", "cost_busy_err")}} for k, m in enumerate(meas)]

    df = pd.DataFrame(rows(1.0, [90, 100, 110], 109) + rows(2.0, [99, 100, 101], 109) + rows(3.0, [100], 100))
    hw = accuracy_async.measured_half_width(df).set_index("rate")["e2e_meas_ci"]
    assert hw[1.0] == pytest.approx(4.302653 * 10 / 3 ** 0.5 / 100, rel=1e-6)
    assert hw[2.0] == pytest.approx(4.302653 / 3 ** 0.5 / 100, rel=1e-6) and hw[3.0] == float("inf")
    # Only 2 req/s is known to 5 % (±2.5 %), and 109 misses it by 9 %; 1 req/s holds 109 in its interval
    # and 3 req/s, with no interval, is predicted exactly.
    assert accuracy_async.verifiable(df).splitlines()[2:] == ["| held-out point | s | 3 | 1 | 0 | 2 |",
                                                             "| held-out point | every calibration (1) | 3 | 1 | 0 | 2 |"]


def test_the_repeats_a_point_needs_follow_from_its_spread(accuracy):
    """Repeats 90, 100, 110 (sd 10 % of the mean): n = 19 leaves t(0.975, 18) * 0.1 / sqrt(19) = 0.0482,
    n = 18 leaves 0.0497, n = 17 0.0514, so 18; identical repeats need the least, 2.  docs/simulator.md's
    counts are h200-tp1's summary.csv through it."""
    assert accuracy.repeats_to_pin([90, 100, 110]) == 18 and accuracy.repeats_to_pin([100, 100]) == 2
    s = pd.read_csv(REPO / "experiments/results/h200-tp1/summary.csv")
    n = {(m, r): accuracy.repeats_to_pin(s[(s["mode"] == m) & (s["rate"] == r)]["mean_e2e_ms"])
         for m, r in (("on", 16), ("off", 16), ("on", 32), ("on", 56))}
    text = " ".join((REPO / "docs/simulator.md").read_text().split())
    assert (f"pinning the mean to 5 % takes {n['on', 16]} repeats at ON 16, {n['off', 16]} at OFF 16, "
            f"{n['on', 32]} at ON 32 and {n['on', 56]} at ON 56") in text


def _verifiable_points(accuracy_async, csv: str) -> tuple[pd.DataFrame, pd.Series, pd.Series]:
    """The unsaturated held-out points of a form's async.csv, with each one's |error| and measured interval."""
    df = pd.read_csv(ACC / csv)
    pp = accuracy_async.per_point(df).merge(accuracy_async.measured_half_width(df), on=["check", "study", "mode", "rate"])
    u = pp[pp["check"].isin(accuracy_async.CHECKS[:2]) & (pp["saturated_meas_share"] <= 0.5)]
    return u, u["mean_e2e_ms_err"].abs(), u["e2e_meas_ci"]


def test_the_verifiable_sentences_are_async_csv_s(accuracy_async):
    """docs/simulator.md's paragraph on what the repeats can verify quotes async.csv (the simulator's
    form) and the linear form's."""
    u, e, ci = _verifiable_points(accuracy_async, "async.csv")
    lu, le, lci = _verifiable_points(accuracy_async, "async-forms-linear/async.csv")
    text = " ".join((REPO / "docs/simulator.md").read_text().split())
    for check in accuracy_async.CHECKS[:2]:
        c, lc = u["check"] == check, lu["check"] == check
        assert (c.sum(), (c & (ci <= 0.05)).sum(), (c & (ci <= 0.05) & (e <= 0.05)).sum()) == (41, 11, 11)
        assert (lc.sum(), (lc & (lci <= 0.05)).sum(), (lc & (lci <= 0.05) & (le <= 0.05)).sum()) == (41, 11, 10)
        assert ((e <= 0.05) | (e <= ci))[c].all()
    known = u[ci <= 0.05]
    lowest = u.groupby("study")["rate"].transform("min")
    assert (known["rate"] == lowest[known.index]).sum() == 2 * 8
    miss = lu[(lci <= 0.05) & (le > 0.05)]
    assert sorted(set(zip(miss["study"], miss["mode"], miss["rate"], strict=True))) == [("h200-tp1-fixed-order", "on", 32.0)]
    by = miss.set_index("check")
    at = u[(u["study"] == "h200-tp1-fixed-order") & (u["mode"] == "on") & (u["rate"] == 32)].set_index("check")
    assert (f"(−{-by.loc['held-out point', 'mean_e2e_ms_err'] * 100:.1f} % with the point held out, "
            f"−{-by.loc['held-out repeat', 'mean_e2e_ms_err'] * 100:.1f} % with the repeat held out; its measured "
            f"mean is known to ±{by.loc['held-out point', 'e2e_meas_ci'] * 100:.1f} %), where the simulator's form "
            f"comes out −{-at.loc['held-out point', 'mean_e2e_ms_err'] * 100:.1f} and "
            f"−{-at.loc['held-out repeat', 'mean_e2e_ms_err'] * 100:.1f} %") in text
    lin_pass = ((le <= 0.05) | (le <= lci)).groupby(lu["check"]).sum().to_dict()
    assert lin_pass == {"held-out point": 38, "held-out repeat": 39}
    assert ("all 41 points pass, with the point held out and with the repeat held out (the linear form: 38 and "
            "39)") in text
    fails = lu[(le > 0.05) & (le > lci)]
    assert set(fails["study"]) == {"h200-tp1-fixed-order"}
    off16 = fails[(fails["mode"] == "off") & (fails["rate"] == 16)].set_index("check")
    on80 = fails[(fails["mode"] == "on") & (fails["rate"] == 80)].set_index("check")
    assert list(on80.index) == ["held-out point"]
    assert (f"OFF 16 (+{off16.loc['held-out point', 'mean_e2e_ms_err'] * 100:.1f} % and "
            f"+{off16.loc['held-out repeat', 'mean_e2e_ms_err'] * 100:.1f} %, its interval "
            f"±{off16.loc['held-out point', 'e2e_meas_ci'] * 100:.1f} %) and, with the point held out, ON 80 "
            f"(+{on80.loc['held-out point', 'mean_e2e_ms_err'] * 100:.1f} %, "
            f"±{on80.loc['held-out point', 'e2e_meas_ci'] * 100:.1f} %)") in text
    df = pd.read_csv(ACC / "async.csv")
    spread = df[(df["study"] == "h200-tp1") & (df["check"] == "held-out point") & (df["mode"] == "on") & (df["rate"] == 56)]
    assert "(ON 56 on h200-tp1: %.0f–%.0f ms)" % (spread["mean_e2e_ms_meas"].min(), spread["mean_e2e_ms_meas"].max()) in text


@pytest.mark.slow
def test_the_default_engine_table_is_what_the_code_gives_on_h200_tp1_async(accuracy_async):
    """The tables above are checked against async.csv; this checks async.csv against the code, on one
    study: h200-tp1-async's 8 points re-simulated from the fit on all of h200-tp1 (virtual time: the
    same numbers).  A change to the fit or the simulator that leaves the committed tables behind fails
    here.  The same fit with its fixed cost 1 % higher is the wrong data the check must refuse."""
    results = REPO / "experiments/results"
    model = accuracy_async._fit(accuracy_async.load_steps(results / "h200-tp1"), "h200-tp1")
    committed = pd.read_csv(ACC / "async.csv").query("study == 'h200-tp1-async' and check == 'another run'")

    def simulated(m):
        return _e2e_sim(accuracy_async.simulate_points(results / "h200-tp1-async", lambda mode, rate: m, "another run"))

    want = committed.set_index(["mode", "rate", "repeat"])["mean_e2e_ms_sim"].sort_index()
    assert len(want) == 8
    pd.testing.assert_series_equal(simulated(model), want, check_exact=False, rtol=1e-9, obj=(
        "async.csv against the code: re-run experiments/sim/accuracy_async.py, async_forms.py, "
        "timestamps.py --calibrations 'step records' and error_budget.py, and re-simulate the seed studies"))
    model.c0_ms *= 1.01
    assert not simulated(model).round(6).equals(want.round(6))


def test_the_default_engine_sentences_are_async_csv_s(accuracy_async):
    """docs/simulator.md's bullets on the simulator's accuracy on vLLM's default engine quote async.csv:
    counts per check and study, the misses, the saturated points and knees, and TTFT at 1 req/s."""
    pp = accuracy_async.per_point(pd.read_csv(ACC / "async.csv"))
    fixed, held = "h200-tp1-fixed-order", ("held-out point", "held-out repeat")
    assert [_within(pp, c, s) for s in ("h200-tp1", fixed) for c in held] == [(4, 6), (5, 6), (5, 8), (7, 8)]
    out10 = pp[pp["check"].isin(held) & pp["study"].isin(["h200-tp1", fixed]) & (pp["saturated_meas_share"] <= 0.5)
               & (pp["mean_e2e_ms_err"].abs() > 0.10)]
    assert out10[["check", "study", "mode", "rate"]].values.tolist() == [["held-out point", fixed, "on", 80.0]]
    assert _tally(pp, held) == (73, 82)
    sat = pp[pp["saturated_meas_share"] > 0.5]
    assert (len(sat), int((sat["saturated_sim_share"] > 0.5).sum())) == (49, 49)
    summary = (ACC / "async-summary.md").read_text().splitlines()[2:]
    knees = [[c.strip() for c in row.split("|")[-3:-1]] for row in summary]
    assert all(k.split(" / ")[0] == k.split(" / ")[1] for pair in knees for k in pair)
    assert [(_within(pp, c, "h200-multiturn-spans"), _worst(pp, c, "h200-multiturn-spans")) for c in held] == \
        [((8, 8), -1.2), ((8, 8), -1.1)]
    assert [(_within(pp, c, "h100-tp1-spans"), _worst(pp, c, "h100-tp1-spans")) for c in held] == \
        [((10, 10), -4.5), ((10, 10), -3.2)]
    assert (_within(pp, "another run", "h100-tp1"), _worst(pp, "another run", "h100-tp1")) == ((8, 10), 8.2)
    w = pp[(pp["check"] == "another workload") & ~pp["study"].str.startswith("h200-shared-fraction")]
    w = w[w["saturated_meas_share"] <= 0.5]
    cell = w["study"].str.startswith("h200-cache-pressure-spans")
    assert [(len(g), int((g["mean_e2e_ms_err"].abs() <= 0.05).sum())) for g in (w[~cell], w[cell])] == [(39, 32), (9, 7)]
    missed = w[w["mean_e2e_ms_err"].abs() > 0.05]
    sweeps = missed[missed["study"].str.startswith("h200-cache-pressure/")]
    off12 = sweeps[(sweeps["mode"] == "off") & (sweeps["rate"] == 12)]["mean_e2e_ms_err"] * 100
    assert (len(off12), f"{off12.max():.1f}", f"{off12.min():.1f}") == (6, "-7.9", "-10.1")
    rest = missed.drop(off12.index)
    assert [(r.study, r.mode, r.rate, round(r.mean_e2e_ms_err * 100, 1)) for r in rest.itertuples()] == [
        ("h200-cache-pressure/groups-48/blocks-6400", "on", 24.0, -7.6), ("h200-cache-pressure-spans", "on", 24.0, -20.3),
        ("h200-cache-pressure-spans-4400", "off", 12.0, -5.6)]
    misses = {(c, s, m, r): _err(pp, c, s, m, r) for c in held for s, m, r in (
        ("h200-tp1", "on", 32), ("h200-tp1", "on", 56), (fixed, "on", 56), (fixed, "on", 80), (fixed, "off", 16),
        ("h200-cache-pressure-spans", "on", 24))}
    assert list(misses.values()) == [-8.1, -7.8, -8.6, 23.1, 5.1, -13.6, -4.8, -5.9, -8.2, 3.0, 0.7, -12.4]
    assert _tally(pp, ["another run"]) == (35, 50)
    assert [_within(pp, "another run", s) for s in ("h200-tp1-async", fixed, "h200-multiturn")] == [(4, 4), (5, 8), (1, 4)]
    assert (_worst(pp, "another run", fixed), _worst(pp, "another run", "h200-multiturn")) == (-10.1, -6.0)
    slo = _unsaturated(pp, "another run", "h200-tp1-slo")
    ok = slo["mean_e2e_ms_err"].abs() <= 0.05
    assert (int(ok.sum()), len(slo), int(ok[slo["mode"] == "off"].sum()), int((slo["mode"] == "off").sum()),
            int(ok[slo["mode"] == "on"].sum()), int((slo["mode"] == "on").sum())) == (9, 15, 6, 6, 3, 9)
    assert _worst(pp, "another run", "h200-tp1-slo") == 31.7
    later = pp[pp["study"].str.startswith("h200-shared-fraction") | (pp["study"] == "h200-tp1-slo")]
    assert round(later["cost_busy_err"].max() * 100) == 10
    shared = pp[pp["study"].str.startswith("h200-shared-fraction")]
    assert (int((shared["mean_e2e_ms_err"].abs() <= 0.05).sum()), len(shared)) == (5, 6)
    one = pp[(pp["check"] == "held-out point") & (pp["study"] == "h200-tp1") & (pp["rate"] == 1)].set_index("mode")
    ttft = [f"{one.loc[m, c]:.1f}" for m in ("on", "off") for c in ("mean_ttft_ms_sim", "mean_ttft_ms_meas")]
    assert ttft == ["14.1", "17.2", "33.4", "34.8"]
    text = " ".join((REPO / "docs/simulator.md").read_text().split())
    for sentence in (
            "**Within 5 %** at 4 of 6 unsaturated points of h200-tp1 with the point held out (5 of 6 with the repeat "
            "held out), and at 5 of 8 of h200-tp1-fixed-order (7 of 8); within 10 % at all of them but ON 80 on "
            "h200-tp1-fixed-order with the point held out (+23.1 %). Over the six GPU-timed calibrations it is within "
            "5 % at 73 of 82 held-out points (the linear form below: 59). Every saturated point of every check is "
            "predicted saturated (49 of 49), and every knee in the table is exact.",
            "within 5 % at all 8 unsaturated points with the point held out (worst −1.2 %) and with the repeat held "
            "out (−1.1 %)",
            "within 5 % at all 10 unsaturated points either way (worst −4.5 % and −3.2 %, ON 48). Calibrated on all "
            "of it, h100-tp1 (another H100, through Ray) comes out within 5 % at 8 of 10 (worst +8.2 %, ON 48).",
            "within 5 % at 32 of 39 unsaturated points of the six cache-pressure sweeps, h200-multiturn and "
            "h200-multiturn-spans, and at 7 of 9 of the two GPU-timed cache-pressure cells. It misses OFF at 12 req/s "
            "in every sweep cell (−7.9 to −10.1 %), ON 24 with 48 groups and 6400 blocks (−7.6 %), and ON 24 in that "
            "cell's GPU-timed re-run (−20.3 %: below).",
            "ON at 32 and 56 req/s on h200-tp1 (−8.1 and −7.8 % with the point held out, −4.8 and −5.9 % with the "
            "repeat held out); ON 56 on h200-tp1-fixed-order (−8.6 and −8.2 %), and there, with the point held out, "
            "ON 80 (+23.1 %) and OFF 16 (+5.1 %); ON 24 on h200-cache-pressure-spans (−13.6 and −12.4 %).",
            "within 5 % at 35 of 50 unsaturated points (the linear form 24): 4 of 4 on h200-tp1-async, 5 of 8 on "
            "h200-tp1-fixed-order (worst −10.1 %, ON 56) and 1 of 4 on h200-multiturn (−6.0 % at worst",
            "up to 10 % long, the period column). Within 5 % at 9 of 15 unsaturated points of h200-tp1-slo: OFF at "
            "all 6 rates, ON at 3 of 9, with the error growing with the load to +31.7 % (ON 76.1 req/s",
            "the shared-fraction cells at 5 of 6.",
            "(14.1 against 17.2 ms, the point held out); OFF's is 33.4 against 34.8 ms."):
        assert sentence in text, sentence


def test_the_linear_form_numbers_in_docs_are_its_async_csv_s(accuracy_async):
    """docs/simulator.md's sentences on the linear form quote its async.csv's per-point table."""
    pp = accuracy_async.per_point(pd.read_csv(ACC / "async-forms-linear/async.csv"))
    text = " ".join((REPO / "docs/simulator.md").read_text().split())

    def span(rows, col, fmt):
        return fmt(rows[col].min() * 100), fmt(rows[col].max() * 100)

    same_lease = pp["study"].isin(["h200-tp1", "h200-tp1-fixed-order", "h200-tp1-async"])
    off16 = pp[same_lease & (pp["mode"] == "off") & (pp["rate"] == 16)]
    assert len(off16) == 6 and (off16["mean_e2e_ms_err"].abs() > 0.05).all()
    assert "(+%s to +%s %%)" % span(off16, "mean_e2e_ms_err", "{:.1f}".format) in text
    assert "%s–%s %% long" % span(off16, "cost_busy_err", "{:.1f}".format) in text
    on80 = pp[(pp["mode"] == "on") & (pp["rate"] == 80) & (pp["study"] == "h200-tp1-fixed-order")]
    assert "(+%s to +%s %%)" % span(on80, "mean_e2e_ms_err", "{:.1f}".format) in text
    assert "%s–%s %% long" % span(on80, "cost_busy_err", "{:.1f}".format) in text
    u = pp[pp["saturated_meas_share"] <= 0.5].assign(ok=lambda d: d["mean_e2e_ms_err"].abs() <= 0.05)
    counts = u.groupby(["check", "study"])["ok"].agg(["sum", "size"])
    assert tuple(counts.loc[("held-out point", "h200-tp1")]) == (3, 6)
    assert tuple(counts.loc[("held-out repeat", "h200-tp1")]) == (3, 6)
    assert tuple(counts.loc[("held-out point", "h200-tp1-fixed-order")]) == (2, 8)
    assert tuple(counts.loc[("held-out repeat", "h200-tp1-fixed-order")]) == (2, 8)
    assert ("Within 5 %** at 3 of 6 unsaturated points of h200-tp1 with the point held out (3 of 6 with the repeat "
            "held out), and at 2 of 8 of h200-tp1-fixed-order either way; within 10 % at all but OFF 16 and ON 32 on "
            "h200-tp1 and ON 80 on h200-tp1-fixed-order") in text
    held = u[u["check"].str.startswith("held-out") & u["study"].isin(["h200-tp1", "h200-tp1-fixed-order"])]
    out10 = held[held["mean_e2e_ms_err"].abs() > 0.10]
    assert sorted(set(zip(out10["study"], out10["mode"], out10["rate"], strict=True))) == [
        ("h200-tp1", "off", 16.0), ("h200-tp1", "on", 32.0), ("h200-tp1-fixed-order", "on", 80.0)]
    short = held[(held["mode"] == "on") & (held["mean_e2e_ms_err"] < -0.05)]
    assert sorted(set(zip(short["study"], short["rate"], strict=True))) == [
        ("h200-tp1", 32.0), ("h200-tp1", 56.0), ("h200-tp1-fixed-order", 16.0), ("h200-tp1-fixed-order", 32.0),
        ("h200-tp1-fixed-order", 40.0), ("h200-tp1-fixed-order", 56.0)]
    neg = short[["mean_e2e_ms_err", "cost_busy_err"]] * -1
    assert "comes out %s–%s %% short" % span(neg, "mean_e2e_ms_err", "{:.1f}".format) in text
    assert "prices the real steps %s–%s %% short" % span(neg, "cost_busy_err", "{:.1f}".format) in text
    worst = short.loc[short["mean_e2e_ms_err"].idxmin()]
    assert (worst["study"], worst["rate"], worst["check"], round(worst["mean_e2e_ms_err"] * 100, 1)) == \
        ("h200-tp1", 32.0, "held-out point", -11.2)


def test_the_linear_form_s_other_workload_sentence_is_its_async_csv_s(accuracy_async):
    pp = accuracy_async.per_point(pd.read_csv(ACC / "async-forms-linear/async.csv"))
    w = pp[(pp["check"] == "another workload") & ~pp["study"].str.startswith("h200-shared-fraction")]
    u, s = w[w["saturated_meas_share"] <= 0.5], w[w["saturated_meas_share"] > 0.5]
    cell = u["study"].str.startswith("h200-cache-pressure-spans")
    rest, spans = u[~cell], u[cell].set_index(["mode", "rate"])["mean_e2e_ms_err"]
    worst = rest.loc[rest["mean_e2e_ms_err"].abs().idxmax()]
    assert (len(rest), int((rest["mean_e2e_ms_err"].abs() <= 0.05).sum())) == (39, 37)
    assert (round(worst["mean_e2e_ms_err"] * 100, 1), worst["study"], worst["mode"], worst["rate"]) \
        == (-5.8, "h200-multiturn", "on", 6)
    assert (len(spans), int((spans.abs() <= 0.05).sum())) == (9, 8)
    missed = u[cell & (u["mean_e2e_ms_err"].abs() > 0.05)]
    assert sorted(zip(missed["study"], missed["mode"], missed["rate"], (missed["mean_e2e_ms_err"] * 100).round(1),
                      strict=True)) == [("h200-cache-pressure-spans", "on", 24.0, -17.7)]
    assert (len(s), int((s["saturated_sim_share"] > 0.5).sum())) == (12, 12)
    text = " ".join((REPO / "docs/simulator.md").read_text().split())
    assert ("within 5 % at 37 of 39 unsaturated points of the six cache-pressure sweeps, h200-multiturn and "
            "h200-multiturn-spans (worst −5.8 %, ON at 6 sessions/s on h200-multiturn), and at 8 of 9 of the two "
            "GPU-timed cache-pressure cells (ON 24 −17.7 % with 6400 blocks: below); it "
            "predicts all 12 saturated points saturated") in text


def test_the_linear_form_s_later_lease_sentence_is_its_async_csv_s(accuracy_async):
    """The linear fit on h200-tp1 against the studies of a later day's H200 (h200-tp1-slo and the
    shared-fraction cells): docs/simulator.md quotes their counts, worst point and period error."""
    pp = accuracy_async.per_point(pd.read_csv(ACC / "async-forms-linear/async.csv"))
    slo = pp[(pp["study"] == "h200-tp1-slo") & (pp["saturated_meas_share"] <= 0.5)]
    worst = slo.loc[slo["mean_e2e_ms_err"].abs().idxmax()]
    assert (int((slo["mean_e2e_ms_err"].abs() <= 0.05).sum()), len(slo)) == (4, 15)
    assert (round(worst["mean_e2e_ms_err"] * 100, 1), worst["mode"], worst["rate"]) == (45.2, "on", 76.1)
    later = pp[pp["study"].str.startswith("h200-shared-fraction") | (pp["study"] == "h200-tp1-slo")]
    assert round(later["cost_busy_err"].max() * 100) == 13
    off16 = later[(later["mode"] == "off") & (later["rate"] == 16)].set_index("study")["mean_e2e_ms_err"] * 100
    cells = off16.drop("h200-tp1-slo")
    assert (len(cells), f"{off16['h200-tp1-slo']:.1f}", f"{cells.min():.1f}", f"{cells.max():.1f}") == \
        (3, "12.2", "14.0", "14.6")
    text = " ".join((REPO / "docs/simulator.md").read_text().split())
    assert ("up to 13 % long, the period column). Within 5 % at 4 of 15 unsaturated points of h200-tp1-slo, with "
            "the error growing with the load to +45.2 % (ON 76.1 req/s") in text
    assert "OFF at 16 req/s is +12.2 % on h200-tp1-slo and +14.0 to +14.6 % in the three cells" in text


def _unsaturated(pp: pd.DataFrame, check: str, studies) -> pd.DataFrame:
    studies = [studies] if isinstance(studies, str) else studies
    return pp[(pp["check"] == check) & pp["study"].isin(studies) & (pp["saturated_meas_share"] <= 0.5)]


def _within(pp: pd.DataFrame, check: str, studies) -> tuple[int, int]:
    """Unsaturated points of ``check`` on ``studies`` within 5 %, and how many there are."""
    u = _unsaturated(pp, check, studies)
    return int((u["mean_e2e_ms_err"].abs() <= 0.05).sum()), len(u)


def _worst(pp: pd.DataFrame, check: str, studies) -> float:
    """The largest error, signed, in %, over those points."""
    u = _unsaturated(pp, check, studies)
    return round(u.loc[u["mean_e2e_ms_err"].abs().idxmax(), "mean_e2e_ms_err"] * 100, 1)


def _tally(pp: pd.DataFrame, checks) -> tuple[int, int]:
    """Unsaturated points of ``checks`` (every study) within 5 %, and how many there are."""
    u = pp[pp["check"].isin(checks) & (pp["saturated_meas_share"] <= 0.5)]
    return int((u["mean_e2e_ms_err"].abs() <= 0.05).sum()), len(u)


def _err(pp: pd.DataFrame, check: str, study: str, mode: str, rate: float) -> float:
    """One point's signed error, in %."""
    at = pp[(pp["check"] == check) & (pp["study"] == study) & (pp["mode"] == mode) & (pp["rate"] == rate)]
    return round(float(at["mean_e2e_ms_err"].iloc[0]) * 100, 1)


def test_the_linear_form_s_h100_sentence_is_its_async_csv_s(accuracy_async):
    """docs/simulator.md on h100-tp1-spans: the linear form held out on it, ON 48's repeats, and its fit
    on h100-tp1."""
    pp = accuracy_async.per_point(pd.read_csv(ACC / "async-forms-linear/async.csv"))
    held = ("held-out point", "held-out repeat")
    assert [_within(pp, c, "h100-tp1-spans") for c in held] == [(8, 10), (9, 10)]
    u = _unsaturated(pp, "held-out point", "h100-tp1-spans")
    out = u[u["mean_e2e_ms_err"].abs() > 0.05]
    assert sorted(zip(out["mode"], out["rate"], (out["mean_e2e_ms_err"] * 100).round(1), strict=True)) == \
        [("on", 8.0, -5.4), ("on", 48.0, 22.1)]
    assert [_worst(pp, c, "h100-tp1-spans") for c in held] == [22.1, 12.6]
    assert (_within(pp, "another run", "h100-tp1"), _worst(pp, "another run", "h100-tp1")) == ((7, 10), 26.0)
    sat = pp[(pp["study"] == "h100-tp1-spans") & (pp["saturated_meas_share"] > 0.5)]
    assert len(sat) == 4 and (sat["saturated_sim_share"] > 0.5).all()
    summ = pd.read_csv(REPO / "experiments/results/h100-tp1-spans/summary.csv")
    on48 = summ[(summ["mode"] == "on") & (summ["rate"] == 48)]["mean_e2e_ms"]
    assert (round(on48.min()), round(on48.max())) == (1392, 1652)
    text = " ".join((REPO / "docs/simulator.md").read_text().split())
    assert ("within 5 % at 8 of 10 unsaturated points with the point held out and 9 of 10 with the repeat held out. "
            "ON at 48 req/s, its highest rate, is the miss in both (+22.1 % and +12.6 %); its three measured repeats "
            "took 1392–1652 ms. With the point held out ON 8 is also outside (−5.4 %). Calibrated on all of it, "
            "h100-tp1 (another H100, through Ray) comes out within 5 % at 7 of 10 (worst +26.0 %, ON 48).") in text


def test_the_multi_turn_sentences_are_the_two_forms_csvs(accuracy_async):
    """docs/simulator.md on h200-multiturn-spans: the linear form held out on it (async-forms-linear/), the
    piecewise form held out, from h200-tp1 and on h200-multiturn (async-forms/async.csv), and how far
    the two runs' measured mean E2E lie apart (their summary.csv files)."""
    def rows(csv, check, study):
        pp = accuracy_async.per_point(pd.read_csv(csv))
        return *_within(pp, check, study), _worst(pp, check, study)

    lin, pw = ACC / "async-forms-linear/async.csv", ACC / "async-forms/async.csv"
    assert rows(lin, "held-out point", "h200-multiturn-spans") == (8, 8, -1.5)
    assert rows(lin, "held-out repeat", "h200-multiturn-spans") == (8, 8, -1.2)
    assert rows(lin, "another workload", "h200-multiturn-spans") == (8, 8, 1.9)
    assert rows(lin, "another workload", "h200-multiturn")[:2] == (2, 4)
    assert rows(pw, "another workload", "h200-multiturn") == (0, 4, -7.0)
    assert rows(lin, "another run", "h200-multiturn") == (2, 4, -6.7)
    assert [rows(pw, c, "h200-multiturn-spans")[:2] for c in ("held-out point", "held-out repeat", "another workload")] \
        == [(8, 8)] * 3
    assert rows(pw, "another workload", "h200-multiturn-spans") == (8, 8, -2.5)
    assert rows(pw, "another run", "h200-multiturn") == (0, 4, -6.0)
    e2e = [pd.read_csv(REPO / f"experiments/results/{s}/summary.csv").groupby(["mode", "rate"])["mean_e2e_ms"].mean()
           for s in ("h200-multiturn-spans", "h200-multiturn")]
    below = 100 * (1 - e2e[0][e2e[1].index] / e2e[1])
    assert (f"{below.min():.1f}", f"{below.max():.1f}") == ("3.1", "5.6")
    slower = load_script("experiments/readme_numbers.py").like_steps_slower(
        REPO / "experiments/results/h200-multiturn", REPO / "experiments/results/h200-multiturn-spans")
    assert (len(slower), f"{100 * slower.min():.1f}", f"{100 * slower.max():.1f}") == (10, "3.9", "7.3")
    text = " ".join((REPO / "docs/simulator.md").read_text().split())
    assert ("within 5 % at all 8 unsaturated points with the point held out (worst −1.5 %) and with the repeat "
            "held out (−1.2 %)") in text
    assert ("on h200-multiturn it is within 5 % at 0 of 4 points (−7.0 % at worst) against the linear form's 2 of "
            "4") in text
    assert ("there the piecewise form is within 5 % at all 8 points held out by point, by repeat and from h200-tp1's "
            "fit (worst −2.5 %), as the linear form is (+1.9 %). Its measured mean E2E is 3.1–5.6 % below "
            "h200-multiturn's at the same rates, and calibrated on it either form puts h200-multiturn short "
            "(piecewise −6.0 % at worst, linear −6.7 %). Like for like, h200-multiturn's decode-only steps took "
            "3.9–7.3 % longer than this run's") in text
    runs = [json.loads(p.read_text()) for p in (REPO / "experiments/results").glob(
        "h200-cache-pressure/groups-*/blocks-*/manifest.json")]
    runs.append(json.loads((REPO / "experiments/results/h200-multiturn/manifest.json").read_text()))
    assert (min(m["started_at"] for m in runs), max(m["ended_at"] for m in runs)) == \
        ("2026-11-30T19:17:46+00:00", "2026-11-30T19:42:54+00:00")
    assert "the same half hour as h200-multiturn (2026-11-30 19:17–19:43 UTC)" in text
    held = accuracy_async.per_point(pd.read_csv(ACC / "async.csv"))  # the simulator's form
    held = held[(held["study"] == "h200-multiturn-spans") & held["check"].str.startswith("held-out")]
    assert len(held) == 16 and (held["saturated_meas_share"] == 0).all() and (held["saturated_sim_share"] == 0).all()
    assert "h200-multiturn-spans saturates at none of its rates, in the measurement and in the simulation" in text


def test_the_cache_pressure_rerun_sentences_are_the_two_forms_csvs(accuracy_async):
    """docs/simulator.md on the two cache-pressure cells re-run with GPU-timed steps: both forms held out
    on them, fitted on h200-tp1 and calibrated on them for the sweeps' same cells (async-forms-linear/
    and async-forms/async.csv); the ON 24 repeats and their arrivals (summary.csv, requests.parquet); how
    much slower the sweeps' cells ran; and the two forms' tallies over every check."""
    cells = {"h200-cache-pressure-spans": "h200-cache-pressure/groups-48/blocks-6400",
             "h200-cache-pressure-spans-4400": "h200-cache-pressure/groups-40/blocks-4400"}
    lin, pw, rf = (accuracy_async.per_point(pd.read_csv(ACC / f))
                   for f in ("async-forms-linear/async.csv", "async-forms/async.csv", "async-forms-roofline/async.csv"))

    def on24(pp):
        at = pp[(pp["study"] == "h200-cache-pressure-spans") & (pp["mode"] == "on") & (pp["rate"] == 24)]
        at = at.set_index("check")
        return [round(at.loc[c, "mean_e2e_ms_err"] * 100, 1) for c in checks]

    six, four = cells
    checks = ("held-out point", "held-out repeat", "another workload")
    assert [_within(pw, c, six) for c in checks] == [(4, 5)] * 3
    assert [_within(lin, c, six) for c in checks] == [(4, 5)] * 3
    assert [_within(pw, c, four) for c in checks[:2]] == [(4, 4)] * 2
    assert [_within(lin, c, four) for c in checks[:2]] == [(4, 4)] * 2
    assert on24(pw) == [-13.5, -12.7, -24.5] and on24(lin) == [-11.1, -10.6, -17.7]
    summ = pd.read_csv(REPO / "experiments/results" / six / "summary.csv")
    on = summ[(summ["mode"] == "on") & (summ["rate"] == 24)].sort_values("repeat")
    assert [round(v) for v in on["mean_e2e_ms"]] == [557, 881]
    req = pd.read_parquet(REPO / "experiments/results" / six / "requests.parquet")
    req = req[(req["mode"] == "on") & (req["rate"] == 24) & ~req["warmup"]]
    spans = req.groupby("repeat")["scheduled_s"].agg(lambda t: t.max() - t.min())
    assert [round(v, 1) for v in spans] == [3.7, 3.1]
    readme = load_script("experiments/readme_numbers.py")
    slower = [readme.like_steps_slower(REPO / "experiments/results" / then, REPO / "experiments/results" / now)
              for now, then in cells.items()]
    assert [(f"{100 * v.min():.1f}", f"{100 * v.max():.1f}") for v in slower] == [("3.4", "7.3"), ("1.0", "6.4")]
    sweeps = list(cells.values())
    assert (_within(pw, "another run", sweeps), _worst(pw, "another run", sweeps)) == ((7, 9), -7.3)
    assert (_within(lin, "another run", sweeps), _worst(lin, "another run", sweeps)) == ((7, 9), -6.9)

    held = ("held-out point", "held-out repeat")
    assert (_tally(pw, held), _tally(lin, held), _tally(rf, held)) == ((63, 82), (59, 82), (60, 82))
    assert (_tally(pw, ["another run"]), _tally(lin, ["another run"]), _tally(rf, ["another run"])) == \
        ((31, 50), (24, 50), (31, 50))
    h100 = [sum(_within(pp, c, "h100-tp1-spans")[0] for c in held) for pp in (lin, pw, rf)]
    assert h100 == [17, 14, 11] and [_within(pp, "another run", "h100-tp1") for pp in (lin, pw)] == [(7, 10)] * 2
    assert (_tally(pw, ["another workload"]), _tally(lin, ["another workload"])) == ((27, 54), (47, 54))
    fixed = "h200-tp1-fixed-order"
    assert [_within(pw, c, fixed) for c in held] == [(4, 8)] * 2
    assert [_within(lin, c, fixed) for c in held] == [(2, 8)] * 2
    assert (_worst(pw, "held-out point", fixed), _worst(lin, "held-out point", fixed)) == (34.9, 32.5)
    text = " ".join((REPO / "docs/simulator.md").read_text().split())
    assert ("Like for like, the sweeps' cells ran their decode-only steps 3.4–7.3 % and 1.0–6.4 % slower than the "
            "re-runs. Calibrated on the re-runs, the piecewise form puts the sweeps' two cells within 5 % at 7 of 9 "
            "points (worst −7.3 %), the linear form at 7 of 9 too (worst −6.9 %)") in text
    assert ("Held out on the re-runs themselves, both forms are within 5 % at 4 of 5 points with 6400 blocks and 4 of "
            "4 with 4400, by point and by repeat. Both miss ON at 24 req/s with 6400 blocks (piecewise −13.5 %, "
            "−12.7 % and −24.5 % from h200-tp1; linear −11.1 %, −10.6 % and −17.7 %), whose two measured repeats "
            "took 557 and 881 ms: the second's 80 requests arrived in 3.1 s rather than 3.7 s.") in text
    assert ("Over every held-out check of the six GPU-timed calibrations the piecewise form is within 5 % at 63 of "
            "82 unsaturated points and the linear form at 59; over the other runs of the same workloads, at 31 and "
            "24 of 50. On the H100 the linear form is the closer (17 of 20 held-out points against 14, and 7 of 10 "
            "either way on h100-tp1). The piecewise form is the closer on h200-tp1-fixed-order too (4 of 8 either "
            "way, against 2 of 8; +34.9 % at ON 80, against +32.5 %). The linear form is the closer, fitted on "
            "h200-tp1, on the other workloads (47 of 54 points against 27)") in text
    assert ("over the six GPU-timed calibrations, it is within 5 % at 60 of 82 points (piecewise 63, linear 59); on "
            "the H100 at 11 of 20.") in text
    assert "Other runs of the same workloads:** 31 of 50 (piecewise 31, linear 24)." in text


def test_the_kv_form_sentences_are_the_forms_csvs(accuracy_async, monkeypatch):
    """docs/simulator.md on the kv and kv-roofline forms (async_forms.py --form kv, --form kv-roofline):
    their async.csv cover every check's points as the linear form's does, and their tallies and the
    points where they move most against the linear form are what the five forms' CSVs give."""
    monkeypatch.chdir(REPO)
    kv_df = pd.read_csv(ACC / "async-forms-kv/async.csv")
    assert accuracy_async.coverage_problems(kv_df) == []
    lin, pw, rf, kv = (accuracy_async.per_point(pd.read_csv(ACC / f)) for f in
                       ("async-forms-linear/async.csv", "async-forms/async.csv", "async-forms-roofline/async.csv",
                        "async-forms-kv/async.csv"))


    held = ("held-out point", "held-out repeat")
    assert [_tally(pp, held) for pp in (kv, lin, pw, rf)] == [(63, 82), (59, 82), (63, 82), (60, 82)]
    assert [_tally(pp, ["another run"]) for pp in (kv, lin, pw, rf)] == [(29, 50), (24, 50), (31, 50), (31, 50)]
    assert [_tally(pp, ["another workload"]) for pp in (kv, lin, pw, rf)] == [(48, 54), (47, 54), (27, 54), (32, 54)]
    h100, fixed = "h100-tp1-spans", "h200-tp1-fixed-order"
    assert [_err(pp, c, h100, "on", 48) for pp in (kv, lin) for c in held] == [-2.9, -3.6, 22.1, 12.6]
    assert [_err(pp, "held-out point", fixed, "on", 80) for pp in (kv, lin)] == [4.4, 32.5]
    assert [_within(pp, "another run", "h100-tp1") for pp in (kv, lin)] == [(9, 10), (7, 10)]
    assert [_worst(pp, "another run", "h100-tp1") for pp in (kv, lin)] == [7.8, 26.0]
    assert [_err(pp, "held-out point", s, "on", 56) for s in ("h200-tp1", fixed) for pp in (kv, lin)] == \
        [-13.1, -7.9, -16.6, -8.6]
    assert [_err(pp, "held-out point", "h200-tp1", "off", 16) for pp in (kv, lin)] == [14.8, 11.8]
    period = {k: {r.split(" | ")[1]: r.split(" | ")[-1].strip(" |") for r in (ACC / f).read_text().splitlines()
                  if r.startswith("| held-out point |") and " | on | 56 | " in r}
              for k, f in (("kv", "async-forms-kv/async.md"), ("lin", "async-forms-linear/async.md"))}
    assert [period[k][s] for k in ("kv", "lin") for s in ("h200-tp1", fixed)] == ["-4.4 %", "-6.2 %", "-1.6 %", "-1.6 %"]
    kvrf_df = pd.read_csv(ACC / "async-forms-kv-roofline/async.csv")
    assert accuracy_async.coverage_problems(kvrf_df) == []
    kvrf = accuracy_async.per_point(kvrf_df)
    assert [_tally(kvrf, c) for c in (held, ["another run"], ["another workload"])] == [(68, 82), (33, 50), (33, 54)]
    assert [_err(kvrf, "held-out point", "h200-tp1", "off", 16)] + [_err(kvrf, c, h100, "on", 48) for c in held] + \
        [_err(kvrf, "held-out point", fixed, "on", 80)] == [2.9, -3.6, -4.1, 3.8]
    wl = kvrf[(kvrf["check"] == "another workload") & kvrf["study"].str.startswith("h200-cache-pressure/")]
    off12 = wl[(wl["mode"] == "off") & (wl["rate"] == 12) & (wl["saturated_meas_share"] <= 0.5)]["mean_e2e_ms_err"]
    assert (len(off12), round(off12.max() * 100, 1), round(off12.min() * 100, 1)) == (6, -7.8, -10.1)
    missed = kvrf[(kvrf["saturated_meas_share"] > 0.5) & (kvrf["saturated_sim_share"] <= 0.5)]
    assert missed[["check", "study", "mode", "rate"]].values.tolist() == [
        ["another workload", "h200-cache-pressure/groups-48/blocks-5600", "on", 24.0]]
    launch = accuracy_async.per_point(pd.read_csv(ACC / "async.csv"))  # the simulator's form
    on32 = [_err(pp, "held-out point", "h200-tp1", "on", 32) for pp in (lin, pw, rf, kv, kvrf, launch)]
    on56 = [_err(pp, "held-out point", "h200-tp1", "on", 56) for pp in (rf, kv, kvrf, lin, launch)]
    assert (on32, on56) == ([-11.2, -9.1, -10.8, -12.5, -11.6, -8.1], [-15.6, -13.1, -17.8, -7.9, -7.8])
    text = " ".join((REPO / "docs/simulator.md").read_text().split())
    for sentence in (
            "all six forms miss ON at 32 req/s (linear −11.2 %, piecewise −9.1 %, roofline −10.8 %, kv −12.5 %, "
            "kv-roofline −11.6 %, launch −8.1 %). The roofline form also misses ON at 56 (−15.6 %), the kv forms too "
            "(−13.1 and −17.8 %), the linear form −7.9 % and the launch form −7.8 %.",
            "Held out, it is within 5 % at 68 of 82 points, the most of the five forms, and on the other runs of the "
            "same workloads at 33 of 50, the most too. OFF 16 on h200-tp1 comes out +2.9 % (linear +11.8 %), ON 48 on "
            "the H100 −3.6 and −4.1 % and ON 80 on h200-tp1-fixed-order +3.8 %. But from h200-tp1's fit it is within "
            "5 % at only 33 of 54 points of the other workloads, as the roofline form (32): OFF 12 comes out "
            "7.8–10.1 % short in every cache-pressure sweep cell, and one saturated point (ON 24, 48 groups, 5600 "
            "blocks) is predicted unsaturated.",
            "at 96 req/s on h200-tp1 ON held at most 32,000 KV tokens, against OFF's 344,112.",
            "it is within 5 % at 63 of 82 points (linear 59, piecewise 63, roofline 60). ON at 48 req/s on the H100 "
            "comes out −2.9 % with the point held out and −3.6 % with the repeat held out (linear +22.1 and +12.6 %). "
            "ON at 80 on h200-tp1-fixed-order comes out +4.4 % (linear +32.5 %).",
            "29 of 50 (linear 24, piecewise and roofline 31). On h100-tp1 it is within 5 % at 9 of 10 points "
            "(linear 7), worst +7.8 % at ON 48 (linear +26.0 %).",
            "48 of 54, the most of the five forms (linear 47, piecewise 27, roofline 32, and 33 for the kv-roofline "
            "form below).",
            "ON at 56 req/s, held out by point, on h200-tp1 (−13.1 %, against −7.9 %) and on h200-tp1-fixed-order "
            "(−16.6 %, against −8.6 %), and OFF at 16 on h200-tp1 (+14.8 %, against +11.8 %). At ON 56 its priced "
            "steps add up to 4.4 and 6.2 % less than the engine loop's measured time over the same real steps "
            "(linear 1.6 and 1.6 % less)"):
        assert sentence in text, sentence


def test_the_launch_form_sentences_are_its_csv_and_h200_tp1_s_launch_fit(accuracy_async, monkeypatch):
    """docs/simulator.md on the launch form, the simulator's (``costmodel.step_cost.fit``): its tallies against
    the other forms, its verifiable points and the errors quoted are what async.csv and the linear
    form's give, and the launch quoted is costmodel.step_cost.fit_host_paired on h200-tp1's steps."""
    from prefixstudy.costmodel.step_cost import busy_steps, fit_host_paired, load_steps

    monkeypatch.chdir(REPO)
    df = pd.read_csv(ACC / "async.csv")
    la, lin = accuracy_async.per_point(df), accuracy_async.per_point(pd.read_csv(ACC / "async-forms-linear/async.csv"))


    held, fixed = ("held-out point", "held-out repeat"), "h200-tp1-fixed-order"
    assert [_tally(pp, c) for pp in (la, lin) for c in (held, ["another run"], ["another workload"])] == \
        [(73, 82), (35, 50), (44, 54), (59, 82), (24, 50), (47, 54)]
    assert [_err(pp, c, fixed, "on", 32) for pp in (la, lin) for c in held] == [-3.4, -3.0, -9.0, -8.3]
    assert [_err(pp, "held-out point", "h200-tp1", "off", 16) for pp in (la, lin)] == [4.1, 11.8]
    assert [_err(la, "held-out point", s, "on", r) for s, r in (("h200-tp1", 32), ("h200-tp1", 56), (fixed, 56), (fixed, 80))] \
        == [-8.1, -7.8, -8.6, 23.1]
    for pp, (hi, lo) in ((la, (-7.9, -10.1)), (lin, (-1.2, -3.6))):
        wl = pp[(pp["check"] == "another workload") & pp["study"].str.startswith("h200-cache-pressure/")]
        off12 = wl[(wl["mode"] == "off") & (wl["rate"] == 12) & (wl["saturated_meas_share"] <= 0.5)]["mean_e2e_ms_err"]
        assert (len(off12), round(off12.max() * 100, 1), round(off12.min() * 100, 1)) == (6, hi, lo)
    rows = df[(df["check"] == "another workload") & df["study"].str.startswith("h200-cache-pressure/")
              & (df["mode"] == "off") & (df["rate"] == 12)]
    by_repeat = rows.groupby("repeat").agg(lo=("mean_e2e_ms_meas", "min"), hi=("mean_e2e_ms_meas", "max"),
                                           sim_lo=("mean_e2e_ms_sim", "min"), sim_hi=("mean_e2e_ms_sim", "max"))
    assert rows.groupby("study").size().tolist() == [2] * 6
    assert sorted(by_repeat.round().astype(int).values.tolist()) == [[664, 671, 626, 626], [991, 1025, 898, 898]]
    verifiable = (ACC / "async-verifiable.md").read_text()
    assert "| held-out point | every calibration (6) | 41 | 11 | 11 | 41 |" in verifiable
    assert "| held-out repeat | every calibration (6) | 41 | 11 | 11 | 41 |" in verifiable
    host = fit_host_paired(busy_steps(load_steps(REPO / "experiments/results/h200-tp1")))
    assert (round(host["c0_ms"], 2), round(host["coef_ms"]["decode_tokens"], 3), round(host["coef_ms"]["prefix_queries"], 4),
            round(host["coef_ms"]["prefix_queries"] * 1214, 2)) == (4.32, 0.045, 0.0008, 0.95)
    text = " ".join((REPO / "docs/simulator.md").read_text().split())
    for sentence in (
            "Fitted on h200-tp1, the launch takes 4.32 ms + 0.045 ms a decoder + 0.0008 ms a hashed token, about 1 ms "
            "for an ON request's 1214 tokens.",
            "it is within 5 % at 73 of 82 points, the most of the six forms (linear 59, kv-roofline 68). The repeats pin "
            "the measured mean at 11 points, and it is within 5 % at all 11 in both checks (linear 10); counting a "
            "prediction inside the measured mean's interval as consistent, all 41 unsaturated points pass in both "
            "checks (linear 38 and 39). ON at 32 req/s on h200-tp1-fixed-order, the linear form's verified miss, comes "
            "out −3.4 % with the point held out and −3.0 % with the repeat held out (linear −9.0 and −8.3 %); OFF 16 "
            "on h200-tp1 +4.1 % (linear +11.8 %).",
            "35 of 50, the most of the six forms (linear 24).",
            "44 of 54 (linear 47, kv 48). OFF 12 comes out 7.9–10.1 % short in the cache-pressure sweep cells "
            "(linear 1.2–3.6 % short)",
            "at OFF 12 their two measured repeats took 664–671 and 991–1025 ms, and the simulated ones, on the same "
            "arrivals, 626 and 898 ms.",
            "ON at 32 and 56 req/s on h200-tp1 (−8.1 and −7.8 %), ON 56 and 80 on h200-tp1-fixed-order (−8.6 and "
            "+23.1 %)"):
        assert sentence in text, sentence
