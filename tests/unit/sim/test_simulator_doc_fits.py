"""docs/simulator.md quotes the step-cost fits of h200-tp1-sync and h200-tp1; they are the fits in
those studies' manifest.json (``step_fit``), at the precision the page prints, and the two parts the
simulator fits on h200-tp1 for vLLM's default engine."""

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


def test_the_quoted_default_engine_parts_are_the_simulator_s_fit_of_h200_tp1():
    """The GPU part and the host's launch docs/simulator.md quotes are ``costmodel.step_cost.fit_study`` on h200-tp1."""
    from prefixstudy.costmodel.step_cost import fit_study
    from prefixstudy.costmodel.step import ROW_TERMS

    m = fit_study(REPO / "experiments/results/h200-tp1")
    c, h = m.coef_ms, m.host
    rows = [c[t] for t in ROW_TERMS if t in c]
    gpu = (f"{m.c0_ms:.3f} ms + {c['decode_tokens']:.3f} ms a decode token + {c['num_prefill_reqs']:.3f} ms a prompt "
           f"request + {c['prompt_step']:.3f} ms a prompt step + {min(rows):.4f}–{max(rows):.4f} ms a GEMM row by "
           f"segment + {c['kv_tokens'] * 1000:.4f} ms per 1,000 KV tokens")
    host = (f"{h['c0_ms']:.3f} + {h['coef_ms']['decode_tokens']:.4f}·decode_tokens + "
            f"{h['coef_ms']['prefix_queries']:.5f}·prefix_queries ms, and the GPU waits for it at "
            f"{h['binding_steps']:,} of its {h['n_steps']:,} steps")
    assert (gpu, host) == (
        "4.555 ms + 0.043 ms a decode token + 1.017 ms a prompt request + 2.176 ms a prompt step + 0.0030–0.0230 ms a "
        "GEMM row by segment + 0.0093 ms per 1,000 KV tokens",
        "4.317 + 0.0452·decode_tokens + 0.00078·prefix_queries ms, and the GPU waits for it at 6,859 of its 45,530 steps")
    assert h["overlap"] == "previous step" and m.n_steps == 45_530
    text = " ".join((REPO / "docs/simulator.md").read_text().split())
    assert gpu in text and host in text


def test_the_quoted_floor_host_part_is_the_linear_fit_of_h200_tp1():
    from prefixstudy.costmodel.step_cost import fit_linear, load_steps

    h = fit_linear(load_steps(REPO / "experiments/results/h200-tp1"), async_scheduling=True).host
    assert set(h["coef_ms"]) == {"decode_tokens"} and "overlap" not in h
    words = (f"{h['c0_ms']:.3f} + {h['coef_ms']['decode_tokens']:.4f}·decode_tokens, above the measured GPU span at "
             f"{h['binding_steps']:,} of its {h['n_steps']:,} steps")
    assert words == "4.536 + 0.0453·decode_tokens, above the measured GPU span at 14,218 of its 45,530 steps"
    assert words in " ".join((REPO / "docs/simulator.md").read_text().split())
