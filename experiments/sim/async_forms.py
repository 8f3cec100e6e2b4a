"""Another step-cost form for vLLM's default engine, put through the same checks as the simulator's.

    PYTHONPATH=. python experiments/sim/async_forms.py [--out experiments/results/sim-accuracy/async-forms]

``sim.cost.fit`` prices a default-engine step as max(GPU part, host part), each linear in the step's
prompt tokens, prompt requests and decode tokens, the host part fitted on the host records.  Those
records are shifted: a prompt step's host record ends before its GPU work does, and the records after
it carry the wait (experiments/results/README.md, h200-tp1-async).  The form here follows what the
GPU-timed steps show (experiments/sim/step_terms.py):

* **GPU part**: c0 + g(T) + c_decode·decode_tokens + c_req·prefill_requests + c_mixed·[the step has
  prompt tokens], where T = prompt + decode tokens (the rows of every GEMM) and g is piecewise linear
  and non-decreasing, with knots at 64, 128, ..., 16384 tokens (each segment's slope a non-negative
  least-squares coefficient).  Fitted on the GPU spans.
* **host part**: h0 + h_decode·decode_tokens + h_req·prefill_requests, the host's own work per step,
  fitted so that over every window of 16 consecutive steps the sum of max(measured GPU span, host part)
  is the sum of the host records (the wall time), by coordinate search.

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
WINDOW = 16  # steps: enough that the wait one record shifts stays inside a window


def gpu_design(prefill, reqs, decode) -> np.ndarray:
    """One row per step: 1, the segments of T = prefill + decode tokens, decode tokens, prefill
    requests, and 1 where the step computes prompt tokens."""
    p, r, d = (np.asarray(a, float) for a in (prefill, reqs, decode))
    t = p + d
    segments = [np.clip(t - KNOTS[i], 0, KNOTS[i + 1] - KNOTS[i]) for i in range(len(KNOTS) - 1)]
    return np.column_stack([np.ones_like(p), *segments, d, r, (p > 0).astype(float)])


def host_design(reqs, decode) -> np.ndarray:
    r, d = (np.asarray(a, float) for a in (reqs, decode))
    return np.column_stack([np.ones_like(d), d, r])


class PiecewiseCost(CostModel):
    """``sim.cost.CostModel`` with the form above: ``gpu`` and ``hostc`` are its coefficients."""

    def __call__(self, f) -> float:
        gpu = float(gpu_design([f.prefill_tokens], [f.num_prefill_reqs], [f.decode_tokens])[0] @ self.gpu)
        return max(gpu, float(host_design([f.num_prefill_reqs], [f.decode_tokens])[0] @ self.hostc))


def windows(b: pd.DataFrame) -> np.ndarray:
    """Each busy step's window: WINDOW consecutive steps of one (mode, rate, repeat)."""
    run = pd.factorize(pd.Series(list(zip(b["mode"], b["rate"], b["repeat"], strict=True))))[0]
    pos = b.groupby(run).cumcount().to_numpy()
    return pd.factorize(run * 1_000_000 + pos // WINDOW)[0]


def fit_host(period: np.ndarray, gpu: np.ndarray, X: np.ndarray, win: np.ndarray) -> np.ndarray:
    """Non-negative h minimising the squared error of sum(max(gpu, X h)) against sum(period) over each
    window: coordinate search, each step halved when no move helps."""
    n = int(win.max()) + 1
    target = np.bincount(win, period, n)

    def loss(h):
        return float(((np.bincount(win, np.maximum(gpu, X @ h), n) - target) ** 2).sum())

    h, step = np.array([4.0] + [0.0] * (X.shape[1] - 1)), np.array([1.0] + [0.05] * (X.shape[1] - 1))
    best = loss(h)
    while step.max() > 1e-5:
        for j, sign in ((j, sign) for j in range(len(h)) for sign in (1, -1)):  # take the first move that helps
            cand = h.copy()
            cand[j] = max(0.0, cand[j] + sign * step[j])
            if (c := loss(cand)) < best:
                best, h = c, cand
                break
        else:  # none helps at this size
            step = step / 2
    return h


def fit_piecewise(steps: pd.DataFrame, source: str) -> PiecewiseCost:
    base = fit(steps, source=source, async_scheduling=True)  # its checks, and what a CostModel records
    b = busy_steps(steps.sort_values(["mode", "rate", "repeat", "t_s"], kind="stable"))
    m = PiecewiseCost(**{k: getattr(base, k) for k in ("c0_ms", "coef_ms", "r2", "n_steps", "source", "timing", "host")})
    gpu = b["step_ms"].to_numpy(float)
    m.gpu = nnls(gpu_design(b["prefill_tokens"], b["num_prefill_reqs"], b["decode_tokens"]), gpu)
    m.hostc = fit_host(b["host_step_ms"].to_numpy(float), gpu,
                       host_design(b["num_prefill_reqs"], b["decode_tokens"]), windows(b))
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
