"""Other step-cost forms for vLLM's default engine, put through the same checks as the simulator's.

    PYTHONPATH=. python experiments/sim/async_forms.py [--form linear|piecewise|roofline|kv|kv-roofline] [--out DIR]

``costmodel.step_cost.fit`` prices a default-engine step with a GPU part over ``costmodel.step_cost.ASYNC_GPU_TERMS`` (piecewise
linear in the step's GEMM rows, decode tokens, prompt requests, a prompt-step indicator and the KV it
holds) and the host's launch of each step while the one before runs (``costmodel.step_cost.fit_host_paired``).
The forms here are what it is compared with.

``--form linear`` is ``costmodel.step_cost.fit_linear``: the GPU part linear in the step's prompt tokens, prompt
requests and decode tokens, fitted on the GPU spans, and the host part a floor under each step's price
(``costmodel.step_cost.fit_host``): a step costs max(GPU part, host part).  Its tables go to
sim-accuracy/async-forms-linear.

``--form piecewise`` keeps that floor host part and gives the GPU part the shape the GPU-timed steps
show (experiments/sim/step_terms.py):

    c0 + g(T) + c_decode·decode_tokens + c_req·prefill_requests + c_mixed·[the step has prompt tokens]

where T = prompt + decode tokens (the rows of every GEMM) and g is piecewise linear and non-decreasing,
with knots at 64, 128, ..., 16384 tokens (each segment's slope a non-negative least-squares
coefficient), fitted on the GPU spans.  Its tables go to sim-accuracy/async-forms.

``--form roofline`` gives the GPU part the shape of a roofline instead: a step is bound either by
reading the weights and KV (a fixed cost, decode tokens and prompt requests) or by computing its GEMM
rows (prompt tokens, prompt requests and decode tokens, with no fixed cost), whichever is slower:

    max(c0 + m_decode·decode_tokens + m_req·prefill_requests,
        p_prefill·prefill_tokens + p_req·prefill_requests + p_decode·decode_tokens)

so a step computing a whole prompt does not pay the fixed cost on top (the linear form prices OFF's
single 1214-token prompt steps on h200-tp1 15 % long for that reason, step-terms.md).  It is fitted
on the GPU spans by alternation: each step is given to the branch that prices it higher, each
branch's coefficients are the non-negative least squares on its steps, until the split repeats one
already tried (no step changes branch, or a few steps near the boundary swap back and forth); of the
rounds, the one whose max prices the steps with the least squared error is kept (``fit_roofline``).
Its tables go to sim-accuracy/async-forms-roofline.

``--form kv`` keeps the linear GPU part and adds the KV the step's requests hold in the cache, each
block once (``kv_tokens``: blocks in use times the block size, which the engine records as
``kv_cache_usage``):

    c0 + c_prefill·prefill_tokens + c_req·prefill_requests + c_decode·decode_tokens + c_kv·kv_tokens

A decode step's attention reads each request's KV, but ON's requests share their cached prefix's
blocks, and a block many requests read in one step is read from memory about once: the linear form,
with one decode coefficient for both, prices ON's decoders at OFF's cost (step-terms.md: 17 % less
per decoder).  The coefficients are the non-negative least squares on the GPU spans; the host part is
the floor.  Its tables go to sim-accuracy/async-forms-kv.

``--form kv-roofline`` is the roofline form with ``kv_tokens`` in its memory branch:
max(c0 + m_decode·decode_tokens + m_req·prefill_requests + m_kv·kv_tokens, the compute branch above),
fitted as the roofline form is.  Its tables go to sim-accuracy/async-forms-kv-roofline.

Then every check of ``accuracy_async.py`` is run with this form in place of ``costmodel.step_cost.fit``, and its
tables are written to ``--out``.  None of these forms is the simulator's: they are what the tables in
docs/simulator.md compare it with.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).parent))
import accuracy_async  # noqa: E402

from prefixstudy.costmodel.engine_fit import nnls  # noqa: E402
from prefixstudy.costmodel.step_cost import CostModel, busy_steps, fit_linear, fit_terms  # noqa: E402
from prefixstudy.costmodel.step import ROW_TERMS  # noqa: E402

PIECEWISE_TERMS = ROW_TERMS + ("decode_tokens", "num_prefill_reqs", "prompt_step")


MEMORY_TERMS = ("decode_tokens", "num_prefill_reqs")  # beside the fixed cost
COMPUTE_TERMS = ("prefill_tokens", "num_prefill_reqs", "decode_tokens")
ROOFLINE_START_PROMPT_TOKENS = 512  # the first split: steps computing more prompt tokens start compute-bound
ROOFLINE_ROUNDS = 100


def roofline_branches(prefill, reqs, decode, kv=None) -> tuple[np.ndarray, np.ndarray]:
    """The memory branch's rows (1, then ``MEMORY_TERMS``, then ``kv`` where given: the kv-roofline
    form) and the compute branch's (``COMPUTE_TERMS``), one per step."""
    terms = dict(zip(("prefill_tokens", "num_prefill_reqs", "decode_tokens"),
                     (np.asarray(a, float) for a in (prefill, reqs, decode)), strict=True))
    ones = np.ones_like(terms["prefill_tokens"])
    memory = [ones] + [terms[t] for t in MEMORY_TERMS] + ([] if kv is None else [np.asarray(kv, float)])
    return np.column_stack(memory), np.column_stack([terms[t] for t in COMPUTE_TERMS])


class RooflineCost(CostModel):
    """``costmodel.step_cost.CostModel`` with the roofline GPU part above (``memory``, ``compute``: each branch's
    coefficients) and the floor host part.  ``reads_kv``: the memory branch prices ``kv_tokens``
    too (the kv-roofline form)."""

    reads_kv = False

    def gpu_roofline_ms(self, prefill, reqs, decode, kv=None) -> np.ndarray:
        mem, comp = roofline_branches(prefill, reqs, decode, kv)
        return np.maximum(mem @ self.memory, comp @ self.compute)

    def __call__(self, f) -> float:
        kv = [f.kv_tokens] if self.reads_kv else None
        gpu = float(self.gpu_roofline_ms([f.prefill_tokens], [f.num_prefill_reqs], [f.decode_tokens], kv)[0])
        return max(gpu, self.host_ms(f))


def roofline_round(mem: np.ndarray, comp: np.ndarray, y: np.ndarray, bound: np.ndarray):
    """One round of the alternation: each branch's non-negative least squares on the steps ``bound``
    gives it (True: compute), the squared error of their max on ``y``, and the split they make."""
    coef = nnls(np.column_stack([mem * ~bound[:, None], comp * bound[:, None]]), y)
    m, c = coef[:mem.shape[1]], coef[mem.shape[1]:]
    return m, c, float(((np.maximum(mem @ m, comp @ c) - y) ** 2).sum()), comp @ c > mem @ m


def fit_roofline(steps: pd.DataFrame, source: str, kv: bool = False) -> RooflineCost:
    """``kv``: the kv-roofline form, whose memory branch prices ``kv_tokens`` too."""
    base = fit_linear(steps, source=source, async_scheduling=True)
    b = busy_steps(steps)
    y = b["step_ms"].to_numpy(float)
    mem, comp = roofline_branches(b["prefill_tokens"], b["num_prefill_reqs"], b["decode_tokens"],
                                  b["kv_tokens"] if kv else None)
    bound = b["prefill_tokens"].to_numpy() > ROOFLINE_START_PROMPT_TOKENS  # compute-bound steps
    seen, best = set(), (np.inf, None, None)
    for _ in range(ROOFLINE_ROUNDS):
        seen.add(np.packbits(bound).tobytes())
        m, c, sse, bound = roofline_round(mem, comp, y, bound)
        if sse < best[0]:
            best = (sse, m, c)
        if np.packbits(bound).tobytes() in seen:  # settled, or back to an earlier split
            break
    _, m, c = best
    out = RooflineCost(**{k: getattr(base, k) for k in ("c0_ms", "coef_ms", "r2", "n_steps", "source", "timing", "host")})
    out.memory, out.compute, out.reads_kv = m, c, kv
    return out


KV_TERMS = ("prefill_tokens", "num_prefill_reqs", "decode_tokens", "kv_tokens")


def fit_piecewise(steps: pd.DataFrame, source: str) -> CostModel:
    return fit_terms(steps, source, PIECEWISE_TERMS)


def fit_kv(steps: pd.DataFrame, source: str) -> CostModel:
    """The linear GPU part with ``kv_tokens`` beside its terms, and the floor host part."""
    return fit_terms(steps, source, KV_TERMS)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--form", choices=("linear", "piecewise", "roofline", "kv", "kv-roofline"), default="piecewise")
    ap.add_argument("--out", type=Path,
                    help="default: experiments/results/sim-accuracy/async-forms[-linear|-roofline|-kv|-kv-roofline]")
    a = ap.parse_args()
    fitter, folder = {"linear": (lambda s, src: fit_linear(s, src, async_scheduling=True), "async-forms-linear"),
                      "piecewise": (fit_piecewise, "async-forms"), "roofline": (fit_roofline, "async-forms-roofline"),
                      "kv": (fit_kv, "async-forms-kv"),
                      "kv-roofline": (lambda s, src: fit_roofline(s, src, kv=True), "async-forms-kv-roofline")}[a.form]
    a.out = a.out or accuracy_async.RESULTS / "sim-accuracy" / folder
    a.out.mkdir(parents=True, exist_ok=True)
    accuracy_async._fit = fitter
    sys.argv = [sys.argv[0], "--out", str(a.out)]
    accuracy_async.main()


if __name__ == "__main__":
    main()
