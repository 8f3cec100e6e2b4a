"""docs/simulator.md quotes the step-cost fits of h200-tp1-sync and h200-tp1; they are the fits in
those studies' manifest.json (``step_fit``), at the precision the page prints, and the host part the
simulator fits on the default engine's studies."""

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
    assert set(h["coef_ms"]) == {"decode_tokens"}
    words = (f"{h['c0_ms']:.3f} + {h['coef_ms']['decode_tokens']:.4f}·decode_tokens, above the measured GPU span at "
             f"{h['binding_steps']:,} of its {h['n_steps']:,} steps")
    assert words == "4.536 + 0.0453·decode_tokens, above the measured GPU span at 14,218 of its 45,530 steps"
    assert words in " ".join((REPO / "docs/simulator.md").read_text().split())


@pytest.mark.parametrize("study", ["h200-cache-pressure-spans", "h200-cache-pressure-spans-4400", "h200-multiturn-spans"])
def test_on_the_gpu_timed_cells_and_sessions_the_host_part_is_above_no_gpu_span(study):
    from prefixstudy.sim.cost import fit_study

    assert fit_study(REPO / "experiments/results" / study).host["binding_steps"] == 0
    assert ("On the GPU-timed cache-pressure cells and multi-turn sessions the host part is above the GPU span at no "
            "step") in " ".join((REPO / "docs/simulator.md").read_text().split())
