"""The two parts the simulator fits on h200-tp1's committed step records for vLLM's default engine:
the GPU span and the host's launch (``costmodel.step_cost.fit_study``), and the linear form's host part."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def test_the_default_engine_parts_fitted_on_h200_tp1():
    """The GPU part and the host's launch ``costmodel.step_cost.fit_study`` fits on h200-tp1."""
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


def test_the_linear_forms_host_part_fitted_on_h200_tp1():
    from prefixstudy.costmodel.step_cost import fit_linear, load_steps

    h = fit_linear(load_steps(REPO / "experiments/results/h200-tp1"), async_scheduling=True).host
    assert set(h["coef_ms"]) == {"decode_tokens"} and "overlap" not in h
    words = (f"{h['c0_ms']:.3f} + {h['coef_ms']['decode_tokens']:.4f}·decode_tokens, above the measured GPU span at "
             f"{h['binding_steps']:,} of its {h['n_steps']:,} steps")
    assert words == "4.536 + 0.0453·decode_tokens, above the measured GPU span at 14,218 of its 45,530 steps"
