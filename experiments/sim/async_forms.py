"""Another step-cost form for vLLM's default engine, put through the same checks as the simulator's.

    PYTHONPATH=. python experiments/sim/async_forms.py [--out experiments/results/sim-accuracy/async-forms]

``sim.cost.fit`` prices a default-engine step as max(GPU part, host part), the GPU part linear in the
step's prompt tokens, prompt requests and decode tokens, fitted on the GPU spans.  The form here keeps
the simulator's host part (``sim.cost.fit_host``) and gives the GPU part the shape the GPU-timed steps
show (experiments/sim/step_terms.py):

    c0 + g(T) + c_decode·decode_tokens + c_req·prefill_requests + c_mixed·[the step has prompt tokens]

where T = prompt + decode tokens (the rows of every GEMM) and g is piecewise linear and non-decreasing,
with knots at 64, 128, ..., 16384 tokens (each segment's slope a non-negative least-squares
coefficient), fitted on the GPU spans.

Then every check of ``accuracy_async.py`` is run with this form in place of ``sim.cost.fit``, and its
tables are written to ``--out``.  The form is not the simulator's: it is what the table in
docs/simulator.md compares against.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).parent))
import accuracy_async  # noqa: E402

from prefixstudy.metrics.engine_fit import nnls  # noqa: E402
from prefixstudy.sim.cost import CostModel, busy_steps, fit  # noqa: E402

KNOTS = np.array([0, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384], float)


def gpu_design(prefill, reqs, decode) -> np.ndarray:
    """One row per step: 1, the segments of T = prefill + decode tokens, decode tokens, prefill
    requests, and 1 where the step computes prompt tokens."""
    p, r, d = (np.asarray(a, float) for a in (prefill, reqs, decode))
    t = p + d
    segments = [np.clip(t - KNOTS[i], 0, KNOTS[i + 1] - KNOTS[i]) for i in range(len(KNOTS) - 1)]
    return np.column_stack([np.ones_like(p), *segments, d, r, (p > 0).astype(float)])


class PiecewiseCost(CostModel):
    """``sim.cost.CostModel`` with the GPU part above (``gpu``, its coefficients) and the simulator's host part."""

    def __call__(self, f) -> float:
        gpu = float(gpu_design([f.prefill_tokens], [f.num_prefill_reqs], [f.decode_tokens])[0] @ self.gpu)
        return max(gpu, self.host_ms(f))


def fit_piecewise(steps: pd.DataFrame, source: str) -> PiecewiseCost:
    base = fit(steps, source=source, async_scheduling=True)  # its checks, its host part, and what a CostModel records
    b = busy_steps(steps)
    m = PiecewiseCost(**{k: getattr(base, k) for k in ("c0_ms", "coef_ms", "r2", "n_steps", "source", "timing", "host")})
    m.gpu = nnls(gpu_design(b["prefill_tokens"], b["num_prefill_reqs"], b["decode_tokens"]), b["step_ms"].to_numpy(float))
    return m


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=accuracy_async.RESULTS / "sim-accuracy/async-forms")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    accuracy_async._fit = fit_piecewise
    sys.argv = [sys.argv[0], "--out", str(a.out)]
    accuracy_async.main()


if __name__ == "__main__":
    main()
