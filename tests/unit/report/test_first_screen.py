"""The report's first screen on runs of any subset of arms, made with the echo engine (no vLLM), and
the saturation codes against the verdicts of metrics.saturation itself.

A one-arm run over rates 10× apart draws its rate axes on a log scale; before the first screen
skipped what needs two arms, its empty caching-gain figure raised matplotlib's "Data cannot be
log-scaled" and the report crashed.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from prefixstudy.cli import main as cli_main
from prefixstudy.config import load_config
from prefixstudy.configs import shipped_config
from prefixstudy.metrics.saturation import saturation
from prefixstudy.report import build_report
from prefixstudy.report.precision import decimals, rounded, with_ci
from prefixstudy.report.render import MD_LINE_MAX, wrap_md
from prefixstudy.report.saturation_codes import cell, codes
from prefixstudy.report.tables import bound_mark
from prefixstudy.results import typed_requests
from prefixstudy.study.orchestrate import run_study

WORDS_MAX = 250  # before the report's first section


def first_screen(md: str) -> str:
    return md.split("\n## ", 1)[0]


def md_tables(text: str) -> list[pd.DataFrame]:
    """Every markdown table of ``text`` as a frame of its cells (text)."""
    out, rows = [], []
    for line in [*text.splitlines(), ""]:
        if line.startswith("|"):
            rows.append([c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]])
        elif rows:
            out.append(pd.DataFrame(rows[2:], columns=rows[0]))
            rows = []
    return out


def assert_first_screen_is_short(md: str) -> pd.DataFrame:
    """At most 250 words, four findings and one table of at most 8 columns before the first
    section, the E2E figure among them; no line of the report over MD_LINE_MAX.  Returns the table."""
    top = first_screen(md)
    assert len(top.split()) <= WORDS_MAX, len(top.split())
    assert 1 <= len([ln for ln in top.splitlines() if ln.startswith("- ")]) <= 4
    assert "(plots/e2e_intervals.png)" in top
    (table,) = md_tables(top)
    assert len(table.columns) <= 8
    assert max(len(line) for line in md.splitlines()) <= MD_LINE_MAX
    return table


# ----------------------------------------------------------------- runs of one arm, and of no caching arm

@pytest.mark.slow
def test_a_one_arm_run_renders_after_rederive(tmp_path):
    res = CliRunner().invoke(cli_main, ["run", "try-echo", "--modes", "off", "--rates", "5,50", "--num-requests", "8",
                                        "--no-report", "--quiet", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    (run,) = (tmp_path / "try-echo").iterdir()
    res = CliRunner().invoke(cli_main, ["report", str(run), "--rederive"])
    assert res.exit_code == 0, res.output
    md = (run / "report.md").read_text()
    table = assert_first_screen_is_short(md)
    assert list(table.columns) == ["rate (req/s)", "OFF E2E (ms)", "saturated"]
    head = pd.read_csv(run / "headline.csv").sort_values("arrival_rate")
    assert table["OFF E2E (ms)"].tolist() == [rounded(m, lo, hi, most=0) for m, lo, hi in
                                              zip(head["off_mean_e2e_ms"], head["off_mean_e2e_lo"],
                                                  head["off_mean_e2e_hi"], strict=True)]
    assert "- Only caching OFF ran, so there is no gain to state." in first_screen(md)
    assert "## Caching gain" not in md and not (run / "plots" / "caching_gain.png").exists()
    assert (run / "plots" / "e2e_intervals.png").stat().st_size > 2000


@pytest.mark.slow
def test_a_run_without_a_caching_arm_compares_its_own_arms(tmp_path):
    cfg = load_config(shipped_config("try-echo.yaml"), {"out": str(tmp_path), "sweep.rates": [5, 50], "sweep.num_requests": 8,
                                   "sweep.modes": ["off", "off-slow"], "sweep.baseline": "off",
                                   "arms": [{"name": "off-slow", "prefix_caching": False,
                                             "engine": {"decode_ms_per_token": 2.0}}]})
    run = run_study(cfg, progress=False)
    build_report(run, n_boot=50, formats=("png",))
    md = (run / "report.md").read_text()
    table = assert_first_screen_is_short(md)
    assert list(table.columns) == ["rate (req/s)", "off-slow E2E (ms)", "OFF E2E (ms)", "gain % [CI]", "saturated"]
    head = pd.read_csv(run / "headline.csv").sort_values("arrival_rate")
    # Twice the decode cost per token: off-slow is slower, so its gain over OFF is negative.
    assert (head["gain_mean_e2e_hi"] < 0).all()
    # A point of eight echo requests can be judged saturated (docs/saturation.md): its gain is a bound.
    marks = [bound_mark(a, b).strip() for a, b in zip(head["off-slow_saturated"], head["off_saturated"], strict=True)]
    assert table["gain % [CI]"].tolist() == [m + with_ci(g, lo, hi, scale=100, most=1) for m, g, lo, hi in
                                             zip(marks, head["gain_mean_e2e"], head["gain_mean_e2e_lo"],
                                                 head["gain_mean_e2e_hi"], strict=True)]
    assert "caching ON" not in first_screen(md)


# ----------------------------------------------------------------- saturation codes

def _point(n=40, gap_s=0.25, e2e_ms=None, unfinished=0):
    """``n`` requests sent every ``gap_s``; E2E per request (default 100 ms); the last ``unfinished``
    still open at the point's end."""
    e2e = np.full(n, 100.0) if e2e_ms is None else np.asarray(e2e_ms, float)
    t = np.arange(n) * gap_s
    err = [""] * (n - unfinished) + ["unfinished: open at the end"] * unfinished
    e2e = np.where(np.array(err) == "", e2e, np.nan)
    return typed_requests(pd.DataFrame({
        "mode": "on", "rate": 1 / gap_s, "warmup": False, "error": err, "request_index": range(n),
        "scheduled_s": t, "sent_s": t, "e2e_ms": e2e, "ttft_ms": e2e / 2, "prompt_tokens": 100, "output_tokens": 10}))


def _steps(t0, t1, waiting):
    t = np.linspace(t0, t1, 200)
    return pd.DataFrame({"t_s": t, "num_running": 4, "num_waiting": waiting})


@pytest.mark.parametrize("name, point, steps, limit, expected", [
    ("kept up", _point(), None, 64, []),
    ("open at the end", _point(unfinished=1), None, 64, ["open"]),
    # The last third takes 20 s each: most complete after the window (extended by 100 ms) closes.
    ("completions fell behind", _point(e2e_ms=[100.0] * 27 + [20000.0] * 13), None, 1000, ["behind"]),
    # 5 s each at 4 req/s: about 20 in the system, at or over 0.8 of a 16-request limit.
    ("ran full", _point(e2e_ms=[5000.0] * 40), None, 16, ["full"]),
    ("waited for admission", _point(), _steps(0, 10, 3), 64, ["waiting"]),
    # No limit, no steps: E2E growing by 0.5 s a request, so the backlog grows through the window.
    ("backlog grew", _point(e2e_ms=100.0 + 500.0 * np.arange(40)), None, None, ["behind", "grew"]),
])
def test_each_rule_s_verdict_gets_its_code(name, point, steps, limit, expected):
    s = saturation(point, steps, limit)
    assert s["saturated"] == bool(expected), s["reason"]
    assert codes(s["reason"]) == expected, s["reason"]


def test_a_rate_s_cell_names_the_arms_their_codes_and_how_many_repeats_saturated():
    summary = pd.DataFrame({
        "mode": ["on", "on", "off", "off", "off"], "rate": [8.0, 8.0, 8.0, 8.0, 16.0], "repeat": [0, 1, 0, 1, 0],
        "status": "ok", "saturated": [False, True, True, True, False],
        "saturation_reason": ["", "ran full: 100% of the window's last half at >= 80% of its 4-request limit",
                              "3 unfinished; completed 70% of arrivals in the window",
                              "requests waited in 90% of the steps of the window's last half", ""]})
    assert cell(summary, ("on", "off"), 8.0) == "ON (1/2) full; OFF open+behind+waiting"
    assert cell(summary, ("off",), 8.0, label=False) == "open+behind+waiting"
    assert cell(summary, ("on", "off"), 16.0) == "no"
    assert codes("backlog grew 0.50 req/s (12% of arrivals; in system 1.0->9.0; a trend test, weaker than the "
                 "server's limit: engine.max_num_seqs); a new rule") == ["grew", "other"]


# ----------------------------------------------------------------- precision and line length

@pytest.mark.parametrize("v, lo, hi, most, text", [
    (0.04, 0.026, 0.054, 1, "4.0 % [2.6, 5.4]"),   # half-width 1.4: its leading 1 keeps a second digit
    (0.424, 0.396, 0.452, 1, "42 % [40, 45]"),      # 2.8: whole points
    (0.829, 0.342, 1.0, 1, "80 % [30, 100]"),       # 33: tens
    (-0.003, -0.012, 0.006, 1, "−0.3 % [−1.2, 0.6]"),
    (0.5, 0.4999, 0.5001, 1, "50.0 % [50.0, 50.0]"),  # never more decimals than asked
])
def test_a_number_keeps_only_the_digits_its_interval_supports(v, lo, hi, most, text):
    assert with_ci(v, lo, hi, scale=100, most=most, unit=" %") == text
    assert decimals(1186.0, 1548.0, 0) == -1 and rounded(1367.0, 1186.0, 1548.0, most=0) == "1370"
    assert with_ci(5.0, float("nan"), float("nan"), most=1) == "5.0"


def test_a_long_paragraph_breaks_between_sentences_and_never_opens_a_block():
    text = ("A sentence that runs on for a while, " * 8 + "and ends. ") * 3 + "- not a list item " * 30
    wrapped = wrap_md(text, width=MD_LINE_MAX)
    lines = wrapped.splitlines()
    assert max(len(x) for x in lines) <= MD_LINE_MAX and " ".join(lines) == text.strip()
    assert all(not x.startswith("- ") for x in lines[1:])
    assert lines[0].endswith("and ends.")  # a sentence ends a line where one fits
    assert wrap_md("short", width=MD_LINE_MAX) == "short"


def test_the_committed_headline_study_s_first_screen_is_short():
    md = (Path(__file__).resolve().parents[3] / "experiments/results/h200-tp1/report.md").read_text()
    assert_first_screen_is_short(md)
