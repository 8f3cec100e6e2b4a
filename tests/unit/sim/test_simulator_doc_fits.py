"""docs/simulator.md quotes the step-cost fits of h200-tp1-sync and h200-tp1; they are the fits in
those studies' manifest.json (``step_fit``), at the precision the page prints."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


def _fit_words(study: str) -> str:
    f = json.loads((REPO / "experiments/results" / study / "manifest.json").read_text())["step_fit"]
    return (f"{f['a_ms']:.3f} + {f['b_ms_per_prefill_token']:.4f}·prefill_tokens + "
            f"{f['c_ms_per_decode_token']:.4f}·decode_tokens + {f['e_ms_per_prefill_req']:.3f}·prefill_requests")


@pytest.mark.parametrize(("study", "steps"), [("h200-tp1-sync", "({n:,} busy steps"), ("h200-tp1", "({n:,} steps")])
def test_the_quoted_fit_is_the_manifest_one(study, steps):
    text = " ".join((REPO / "docs/simulator.md").read_text().split())
    n = json.loads((REPO / "experiments/results" / study / "manifest.json").read_text())["step_fit"]["n"]
    assert f"On {study} " + steps.format(n=n) in text or f"on {study} " + steps.format(n=n) in text
    assert _fit_words(study) in text, f"docs/simulator.md: {study}'s fit is not {_fit_words(study)}"


def test_the_sync_fit_is_the_one_the_page_was_checked_against():
    assert _fit_words("h200-tp1-sync") == ("6.234 + 0.0207·prefill_tokens + 0.0712·decode_tokens + "
                                           "2.018·prefill_requests")


def test_the_quoted_host_part_is_the_async_fit_of_h200_tp1():
    from prefixstudy.sim.cost import fit_study

    h = fit_study(REPO / "experiments/results/h200-tp1").host
    c = h["coef_ms"]
    words = (f"{h['c0_ms']:.3f} + {c['prefill_tokens']:.4f}·prefill_tokens + {c['decode_tokens']:.4f}·decode_tokens + "
             f"{c['num_prefill_reqs']:.3f}·prefill_requests (R² {h['r2']:.3f}")
    assert words == "4.531 + 0.0217·prefill_tokens + 0.0616·decode_tokens + 0.315·prefill_requests (R² 0.943"
    assert words in " ".join((REPO / "docs/simulator.md").read_text().split())
