"""The gain against hit rate (metrics.hit_rate_axis) on hand-made runs with known answers: where
caching starts to pay at each rate, the throughput gain and its interval, and a cell whose hit
rate is off the workload's (a cache that did not work) flagged and left out of the reading."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from prefixstudy.shared.bootstrap import t_quantile
from prefixstudy.metrics.hit_rate_axis import (HIT_RATE_COLUMNS, Cell, gain_by_hit_rate, pays_from, pays_sentence,
                                               throughput_gain, top_sentences)

# The seed prompt (1214 tokens) in blocks of 16 at shared fractions 0, 0.25, 0.5, 0.75, 0.95.
WORKLOAD = {0.0: 0 / 1214, 0.25: 288 / 1214, 0.5: 592 / 1214, 0.75: 896 / 1214, 0.95: 1152 / 1214}


def arms(rate_rows: list[tuple[float, float, float, float]], hit: float) -> pd.DataFrame:
    """arms.csv of one run: per (rate, gain, lo, hi), ON against OFF."""
    return pd.DataFrame([{"rate": r, "arm": "on", "baseline": "off", "n_repeats": 2, "arrival_rate": r * 1.01,
                          "gain_mean_e2e": g, "gain_mean_e2e_lo": lo, "gain_mean_e2e_hi": hi,
                          "gain_is_bound": r > 10, "hit_rate": hit, "hit_rate_expected": 0.6}
                         for r, g, lo, hi in rate_rows])


def summary(rates: list[float], on: list[float], off: list[float]) -> pd.DataFrame:
    """summary.csv's output tokens per second: each rate's repeats ON then OFF."""
    rows = []
    for rate in rates:
        rows += [{"mode": "on", "rate": rate, "repeat": k, "output_tok_s": v} for k, v in enumerate(on)]
        rows += [{"mode": "off", "rate": rate, "repeat": k, "output_tok_s": v} for k, v in enumerate(off)]
    return pd.DataFrame(rows)


def sweep(lows_at_1: list[float], lows_at_16: list[float], hits: dict[float, float] | None = None) -> dict:
    """Five cells; at 1 req/s and at 16 req/s the E2E gain's lower ends given, per fraction."""
    hits = hits or WORKLOAD
    return {f: Cell(arms([(1.0, lo1 + 0.05, lo1, lo1 + 0.1), (16.0, lo16 + 0.05, lo16, lo16 + 0.1)], hits[f]),
                    summary([1.0, 16.0], [110.0, 120.0], [100.0, 100.0]), WORKLOAD[f])
            for f, lo1, lo16 in zip(WORKLOAD, lows_at_1, lows_at_16, strict=True)}


def test_one_row_per_fraction_and_rate_with_both_gains():
    t = gain_by_hit_rate(sweep([-0.05, -0.01, 0.01, 0.03, 0.05], [-0.05, 0.1, 0.3, 0.5, 0.7]))
    assert list(t.columns) == HIT_RATE_COLUMNS
    assert t["shared_fraction"].tolist() == [0.0, 0.0, 0.25, 0.25, 0.5, 0.5, 0.75, 0.75, 0.95, 0.95]
    assert t["rate"].tolist() == [1.0, 16.0] * 5
    assert t["hit_rate_ok"].all() and t["pays"].tolist() == [False, False, False, True, True, True, True, True,
                                                              True, True]
    # Output tokens/s ON 110 and 120 against OFF's 100: gains 0.10 and 0.20, t(1) over the two.
    half = t_quantile(0.975, 1) * 0.1 / math.sqrt(2) / math.sqrt(2)
    assert t["gain_throughput"].tolist() == pytest.approx([0.15] * 10)
    assert t["gain_throughput_lo"].iloc[0] == pytest.approx(0.15 - half) == pytest.approx(-0.48531, abs=1e-4)
    assert t["gain_is_bound"].tolist() == [False, True] * 5


def test_caching_pays_from_the_lowest_hit_rate_whose_every_higher_one_pays():
    p = pays_from(gain_by_hit_rate(sweep([-0.05, 0.02, -0.01, 0.03, 0.05], [-0.05, 0.1, 0.3, 0.5, 0.7])))
    # 1 req/s: 0.25 pays, 0.5 does not, 0.75 and 0.95 do: it pays from 0.75 on.
    assert p["pays_from_hit_rate"].tolist() == [896 / 1214, 288 / 1214]
    assert p["arrival_rate"].tolist() == [1.01, 16.16]
    assert p["top_hit_rate"].tolist() == [1152 / 1214] * 2
    assert p["top_gain_mean_e2e_lo"].tolist() == pytest.approx([0.05, 0.7])
    assert pays_sentence(p) == ("Caching starts to pay (the mean-E2E gain's 95 % interval above 0, there and at every "
                                "higher hit rate) at hit rate 0.738 at 1.01 req/s; at hit rate 0.237 at 16.2 req/s.")


def test_no_hit_rate_pays_is_said():
    p = pays_from(gain_by_hit_rate(sweep([-0.05, -0.04, -0.03, -0.02, -0.01], [-0.05, 0.1, 0.3, 0.5, 0.7])))
    assert math.isnan(p["pays_from_hit_rate"].iloc[0])
    assert pays_sentence(p).endswith("at no hit rate measured at 1.01 req/s (up to 0.949); at hit rate 0.237 at "
                                     "16.2 req/s.")
    assert top_sentences(p)[0] == ("At 1.01 req/s and hit rate 0.949: mean E2E 4.0 % [-1.0, 9.0] lower, throughput "
                                   "15.0 % [-48.5, 78.5] higher.")


def test_a_cell_whose_hit_rate_is_off_the_workload_s_is_flagged_and_left_out():
    """Wrong data: at fraction 0.5 the arm measured a hit rate of 0.99, more than the workload lets any
    cache serve (a cache left warm from an earlier run), and no gain there.  Read as it stands, the
    highest hit rate would not pay and caching would pay at no hit rate at 16 req/s."""
    hits = {**WORKLOAD, 0.5: 0.99}
    t = gain_by_hit_rate(sweep([-0.05, -0.01, 0.01, 0.03, 0.05], [-0.05, 0.1, -0.01, 0.5, 0.7], hits))
    assert t.loc[t["shared_fraction"] == 0.5, "hit_rate_ok"].tolist() == [False, False]
    assert t.loc[t["shared_fraction"] != 0.5, "hit_rate_ok"].all()
    unchecked = pays_from(t.assign(hit_rate_ok=True))
    assert math.isnan(unchecked["pays_from_hit_rate"].iloc[1]) and unchecked["top_hit_rate"].iloc[1] == 0.99
    p = pays_from(t)
    assert p["pays_from_hit_rate"].tolist() == [896 / 1214, 288 / 1214]
    assert p["top_hit_rate"].tolist() == [1152 / 1214] * 2
    assert p["flagged"].tolist() == [1, 1]
    assert top_sentences(p)[1].endswith(" 1 cell(s) left out: hit rate off the workload's.")


def test_throughput_gain_pairs_repeats_and_has_no_interval_from_one():
    s = summary([4.0], [150.0], [100.0])
    g, lo, hi, n = throughput_gain(s, 4.0, "on", "off")
    assert (g, n) == (0.5, 1) and math.isnan(lo) and math.isnan(hi)
    # A repeat only one arm ran is not paired.
    s = pd.concat([summary([4.0], [150.0, 130.0], [100.0, 100.0]),
                   pd.DataFrame([{"mode": "on", "rate": 4.0, "repeat": 2, "output_tok_s": 999.0}])])
    g, lo, hi, n = throughput_gain(s, 4.0, "on", "off")
    assert n == 2 and g == pytest.approx(0.4)
    assert (lo, hi) == pytest.approx((0.4 - t_quantile(0.975, 1) * 0.1, 0.4 + t_quantile(0.975, 1) * 0.1))


def test_without_a_known_block_size_the_runner_s_replay_is_the_reference():
    cells = sweep([-0.05, -0.01, 0.01, 0.03, 0.05], [-0.05, 0.1, 0.3, 0.5, 0.7])
    cells[0.5] = Cell(cells[0.5].arms, cells[0.5].summary, math.nan)  # arms.csv's hit_rate_expected: 0.6
    t = gain_by_hit_rate(cells)
    assert t.loc[t["shared_fraction"] == 0.5, "hit_rate_workload"].tolist() == [0.6, 0.6]
    assert t.loc[t["shared_fraction"] == 0.5, "hit_rate_ok"].tolist() == [False, False]  # 0.488 measured
    cells[0.5] = Cell(arms([(1.0, 0.05, 0.01, 0.1)], 0.59), cells[0.5].summary, math.nan)
    assert gain_by_hit_rate({0.5: cells[0.5]})["hit_rate_ok"].tolist() == [True]
