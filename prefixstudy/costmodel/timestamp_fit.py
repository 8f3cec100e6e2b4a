"""Stage: cost model.  The step cost fitted to a run's request timestamps alone, for a run without
step records (an HTTP server, ``vllm-server``, SGLang): the same ``CostModel`` as the step-record fit
(``costmodel.step_cost``), found with a simulator inside the fit (``fit``'s ``simulate``:
``sim.fit_requests`` reads the run's folder and passes vLLM's scheduler).

What a request's timestamps give is its TTFT and its mean gap between tokens (TPOT); what they
depend on is the step cost *and* the schedule (how many requests shared each step, which steps
carried prompts), which only the scheduler knows.  So:

1. **A first guess, by least squares on the timestamps** (``first_guess``).  A request's decode
   span holds ``out - 1`` steps; the requests in decode beside it (from their own spans) give the
   decode tokens of those steps, and the requests whose first token came inside the span give the
   prompt tokens and prefills computed there.  Its TTFT is about one step with its own prompt.  One
   non-negative fit (``costmodel.engine_fit.nnls``) over those rows.
2. **A coordinate search with the simulator inside** (``search``): each coefficient in turn is
   moved up and down by a step, every fitted point is simulated (vLLM's scheduler, on the point's
   own arrival schedule), and the move is kept if the error went down; the step halves once no
   move helps, and the search ends when the step falls below ``min_step`` (``MAX_EVALS`` is only a
   backstop: a search cut short ends wherever its start led it).  The error is the root mean
   square, over the points, of log(simulated / measured) mean TPOT and, at weight
   ``TTFT_WEIGHT``, mean TTFT: a client's TTFT also holds the server's own latency (HTTP,
   detokenising), which the simulator does not model.

To stay fast on a small machine the fit simulates a subsample: the first ``MAX_REQUESTS`` requests
of one repeat of each unsaturated point (the arrival schedule's first requests are the same in a
shorter schedule, so they are compared with the same measured requests).

Refused (``check_loads``): a run with fewer than ``MIN_RATES`` distinct rates among its unsaturated
points.  At one load every step carries about the same batch, so the fixed cost of a step and its
cost per decode token trade off freely.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pandas as pd

from prefixstudy.costmodel.engine_fit import nnls
from prefixstudy.costmodel.step_cost import CostModel
from prefixstudy.errors import UserError

TERMS = ("prefill_tokens", "num_prefill_reqs", "decode_tokens")  # fitted besides c0
MIN_RATES = 2
MAX_REQUESTS = 200
MAX_EVALS = 200  # simulations of the fitted points: a backstop (module docstring, step 2)
TTFT_WEIGHT = 0.25
TIMING = "request-timestamps"
POINT = ["mode", "rate", "repeat"]


def finished(req: pd.DataFrame) -> pd.DataFrame:
    """Measured requests that returned every token (their TTFT and TPOT are whole)."""
    ok = ~req["warmup"].astype(bool) & (req["error"].fillna("") == "") & np.isfinite(req["ttft_ms"])
    return req[ok & np.isfinite(req["tpot_ms"])]


def fit_points(req: pd.DataFrame, summary: pd.DataFrame, max_requests: int = MAX_REQUESTS) -> pd.DataFrame:
    """The fit's subsample: per unsaturated (mode, rate), its lowest repeat, with the mean TTFT, TPOT
    and E2E of its first ``max_requests`` requests that finished (by index: the simulated ones are
    the same requests)."""
    req = finished(req)
    if len(summary) and "saturated" in summary:
        sat = summary.loc[summary["saturated"].astype(bool), POINT].itertuples(index=False)
        bad = {(m, float(r), int(k)) for m, r, k in sat}
        req = req[[(m, float(r), int(k)) not in bad for m, r, k in req[POINT].itertuples(index=False)]]
    first = req.groupby(["mode", "rate"])["repeat"].transform("min")
    req = req[(req["repeat"] == first) & (req["request_index"] < max_requests)]
    out = req.groupby(POINT, sort=True).agg(n=("ttft_ms", "size"), ttft_ms=("ttft_ms", "mean"),
                                            tpot_ms=("tpot_ms", "mean"), e2e_ms=("e2e_ms", "mean"))
    return out.reset_index()


def check_loads(points: pd.DataFrame, where: str) -> None:
    rates = sorted(set(points["rate"]))
    if len(rates) < MIN_RATES:
        have = ", ".join(f"{r:g}" for r in rates) or "none"
        raise UserError(f"--calibration {where}: a fit from request timestamps needs unsaturated points at "
                        f"{MIN_RATES} or more request rates to tell a step's fixed cost from its cost per decode "
                        f"token; the run has {len(rates)} (rates: {have})")


def first_guess(req: pd.DataFrame, points: pd.DataFrame, max_requests: int = MAX_REQUESTS) -> dict[str, float]:
    """Coefficients from the timestamps by least squares (module docstring, step 1)."""
    rows, ys = [], []
    sub = finished(req)
    sub = sub[sub["request_index"] < max_requests]
    for (mode, rate, rep), g in sub.groupby(POINT):
        if not ((points["mode"] == mode) & (points["rate"] == rate) & (points["repeat"] == rep)).any():
            continue
        a = g["sent_s"].to_numpy(float) + g["ttft_ms"].to_numpy(float) / 1e3  # first token
        b = g["sent_s"].to_numpy(float) + g["e2e_ms"].to_numpy(float) / 1e3  # last token
        steps = g["output_tokens"].to_numpy(float) - 1
        new = (g["prompt_tokens"] - g["num_cached_tokens"]).to_numpy(float)
        overlap = np.clip(np.minimum(b[:, None], b[None, :]) - np.maximum(a[:, None], a[None, :]), 0, None)
        span = np.maximum(b - a, 1e-9)
        decoders = overlap.sum(axis=1) / span
        inside = (a[None, :] > a[:, None]) & (a[None, :] <= b[:, None])  # j's first token in i's span
        keep = steps > 0
        rows.append(np.column_stack([steps, inside @ new, inside.sum(axis=1), steps * decoders])[keep])
        ys.append(((b - a) * 1e3)[keep])
        at_first = (a[None, :] >= a[:, None]) & (a[None, :] < b[:, None])  # decoding when i's first token came
        w = math.sqrt(TTFT_WEIGHT)
        rows.append(w * np.column_stack([np.ones(len(g)), new, np.ones(len(g)), at_first.sum(axis=0)]))
        ys.append(w * g["ttft_ms"].to_numpy(float))
    coef = nnls(np.vstack(rows), np.concatenate(ys))
    return {"c0": float(coef[0]), **{t: float(c) for t, c in zip(TERMS, coef[1:], strict=True)}}


def cost_model(x: dict[str, float], source: str = "", host: dict | None = None) -> CostModel:
    """``x``'s step price; with ``host`` (a ``CostModel.host``) the engine it prices is pipelined."""
    return CostModel(x["c0"], {t: x[t] for t in TERMS if x[t] > 0}, source=source, timing=TIMING,
                     host=dict(host or {}))


def client_offset_ms(sim: pd.DataFrame, meas: pd.DataFrame) -> float:
    """What a client's TTFT holds beyond the engine's (the server's HTTP and output path), as one
    constant: the median, over the points, of measured minus simulated mean TTFT, at least 0."""
    m = meas.merge(sim, on=POINT, suffixes=("_meas", "_sim"))
    d = (m["ttft_ms_meas"] - m["ttft_ms_sim"]).replace([np.inf, -np.inf], np.nan).dropna()
    return max(0.0, float(d.median())) if len(d) else 0.0


def point_errors(sim: pd.DataFrame, meas: pd.DataFrame, offset_ms: float = 0.0) -> pd.DataFrame:
    """Per point, relative error of the simulated means (simulated / measured - 1), the simulated
    TTFT and E2E taken ``offset_ms`` later (``client_offset_ms``)."""
    m = meas.merge(sim, on=POINT, suffixes=("_meas", "_sim"))
    m["offset_ms"] = offset_ms
    m["ttft_ms_sim"] += offset_ms
    m["e2e_ms_sim"] += offset_ms
    for k in ("ttft_ms", "tpot_ms", "e2e_ms"):
        m[f"{k}_err"] = m[f"{k}_sim"] / m[f"{k}_meas"] - 1
    return m


def loss(err: pd.DataFrame) -> float:
    lt, ld = np.log1p(err["ttft_ms_err"]), np.log1p(err["tpot_ms_err"])
    return float(np.sqrt(np.mean(ld ** 2 + TTFT_WEIGHT * lt ** 2)))


def error_summary(err: pd.DataFrame) -> dict:
    """The fit's error on its own points, as recorded in cost_model.json and the manifest."""
    out = {"points": int(len(err)), "requests": int(err["n_meas"].sum())}
    for k in ("e2e_ms", "tpot_ms", "ttft_ms"):
        e = err[f"{k}_err"].abs()
        out[f"{k.removesuffix('_ms')}_mean_abs_err"] = float(e.mean())
        out[f"{k.removesuffix('_ms')}_max_abs_err"] = float(e.max())
    return out


@dataclass
class SearchResult:
    x: dict[str, float]
    loss: float
    errors: pd.DataFrame
    n_evals: int


def search(evaluate, x0: dict[str, float], ref: dict[str, float], step: float = 0.2, min_step: float = 0.01,
           max_evals: int = MAX_EVALS) -> SearchResult:
    """Coordinate search (module docstring, step 2).  ``evaluate(x)`` returns the per-point errors;
    ``ref[k]`` is the size of a move of coefficient k when it is 0 (its first guess can be).  A move
    that helps is repeated, twice as long each time, while it keeps helping."""
    x = dict(x0)
    best_err = evaluate(x)
    best, n = loss(best_err), 1

    def moved(x: dict, k: str, d: float) -> dict:
        return {**x, k: max(0.0, x[k] + d)}

    while step >= min_step and n < max_evals:
        improved = False
        for k in tuple(x0):
            for sign in (1, -1):
                d = sign * step * max(x[k], ref[k])
                while n < max_evals and (y := moved(x, k, d))[k] != x[k]:
                    err = evaluate(y)
                    n += 1
                    if (v := loss(err)) >= best:
                        break
                    x, best, best_err, improved = y, v, err, True
                    d *= 2
                if improved:
                    break
        if not improved:
            step /= 2
    return SearchResult(x, best, best_err, n)


def fit(req: pd.DataFrame, points: pd.DataFrame, x0: dict[str, float], simulate: Callable[[CostModel], pd.DataFrame],
        source: str, max_requests: int = MAX_REQUESTS, max_evals: int = MAX_EVALS, offset: bool = True,
        host: dict | None = None) -> CostModel:
    """The step cost whose simulated points come closest to ``points`` (``fit_points``), searched from
    ``x0`` (``first_guess``).  ``simulate(cost)`` gives the simulated means at every point (the columns
    of ``fit_points``).  ``offset``: the simulated TTFT and E2E are taken a client's offset later
    (``client_offset_ms``).  ``host``: a fixed host part (``CostModel.host``) kept in every cost tried.
    The error on the fitted points is in the model's ``fit_error``."""
    def evaluate(x):
        run = simulate(cost_model(x, host=host))
        return point_errors(run, points, client_offset_ms(run, points)) if offset else point_errors(run, points)

    # A zero coefficient moves by what moves c0 by a tenth at the points' typical step.
    new = (req["prompt_tokens"] - req["num_cached_tokens"]).clip(lower=1).mean()
    ref = {"c0": 0.1 * max(x0["c0"], 1e-3)}
    ref |= {"prefill_tokens": ref["c0"] / new, "num_prefill_reqs": ref["c0"], "decode_tokens": ref["c0"] / 8}
    res = search(evaluate, x0, ref, max_evals=max_evals)
    cost = cost_model(res.x, source, host)
    cost.n_steps = 0
    cost.fit_error = {**error_summary(res.errors), "loss": res.loss,
                      "client_offset_ms": float(res.errors["offset_ms"].iloc[0]),
                      "simulations": res.n_evals,
                      "first_guess": x0, "max_requests_per_point": max_requests}
    cost.note = (f"fitted to request timestamps: {len(points)} points, {res.n_evals} simulations of them; "
                 f"mean |error| E2E {cost.fit_error['e2e_mean_abs_err']:.1%}, TPOT "
                 f"{cost.fit_error['tpot_mean_abs_err']:.1%}, TTFT {cost.fit_error['ttft_mean_abs_err']:.1%}")
    return cost
