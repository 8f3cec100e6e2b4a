"""Where caching's gain comes from, request by request.

Each counted request's E2E is split, on the clocks that measured it, into

* **queue**: the engine's queue stamp (``queue_ms``), waiting for admission;
* **own prefill**: the rest of its TTFT, its own prompt's work and the step that carried it;
* **prefill stalls**: in the engine steps that ran while it decoded (those that ended between its
  first and last token, on the host's monotonic clock that both the client and the engine core
  read), the time other requests' prompt chunks added to them.  A prompt chunk co-batched with a
  decode makes that token late: this is where another request's prefill reaches into this one's
  latency.  Two measures price it (``MEASURES``):

  - **fitted**: the step-cost fit's prefill part of each step (``costmodel.engine_fit``: per prompt
    token, per prefilling request, per context token of a prefill).  One fit over every busy step,
    which OFF's long saturated steps dominate, so it can misprice the short mixed steps that matter
    at a calm rate;
  - **model-free**: each step's excess over the median decode-only step of the same decode batch
    size in the same series (``metrics.step_excess``), no fit at all;
* **decode steps**: the rest of those steps' time, the decode work of the batch it rode in (larger
  when more requests are in flight) and the per-step overhead;
* **unpriced**: the time of steps it rode in that a measure cannot split (model-free: a decode
  batch size with no decode-only baseline, or a series that broke ``step_excess``'s invariant);
  0 for the fit;
* **residual**: its E2E less the others, the time between its tokens that no step it rode in holds
  (output processing, the token's trip to the client, idle gaps).

Per arm and rate the parts' means add up to the mean E2E exactly (the residual closes it), so
(OFF - ON) / OFF of each part adds up to the measured gain of mean E2E: the split says how much of
the gain each part is, and the residual says how much the step records leave unexplained.  The
gain and its parts are over the requests counted in both arms (same repeat and request index), the
pairs the headline's gain uses; their 95 % intervals are Student's t over the repeats' own splits
(``shared.bootstrap.over_repeats``).

Pure: requests, iterations and the fit's coefficients in, a table out.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from prefixstudy.costmodel import engine_fit
from prefixstudy.metrics import step_excess
from prefixstudy.metrics.requests import counted
from prefixstudy.shared.bootstrap import over_repeats, rate_seed

PARTS = ("queue", "own_prefill", "prefill_stalls", "decode_steps", "unpriced", "residual")
MEASURES = ("fitted", "model-free")


def prefill_ms(steps: pd.DataFrame, coef: np.ndarray) -> np.ndarray:
    """Each step's fitted prompt work, ms: b per prompt token, e per prefilling request, k per context
    token of a prefill (the prompt tokens and the cached ones they attend)."""
    a, b, e, c, k = (float(x) for x in coef)
    return (b * steps["prefill_tokens"].to_numpy(float) + e * steps["num_prefill_reqs"].to_numpy(float)
            + k * (steps["prefill_tokens"].to_numpy(float) + steps["cached_tokens"].to_numpy(float)))


def priced_parts(requests: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """One row per counted request that has engine stamps and steps in its point: its key, e2e_ms and
    the ``PARTS`` in ms (they add up to e2e_ms).  ``steps``: the point's per-step rows with
    ``prompt_ms``, what other requests' prompts added to each (NaN: unpriced)."""
    ok = counted(requests)
    ok = ok[ok["queue_ms"].notna() & ok["ttft_ms"].notna()]
    keys = ["mode", "rate", "repeat"]
    by_point = dict(iter(steps.sort_values("t_s").groupby(keys, sort=False)))
    rows = []
    for key, reqs in ok.groupby(keys, sort=True):
        st = by_point.get(key)
        if st is None:
            continue
        t, prompt = st["t_s"].to_numpy(float), st["prompt_ms"].to_numpy(float)
        ms = st["step_ms"].to_numpy(float)
        pre, miss, tot = (np.concatenate([[0.0], np.cumsum(v)])
                          for v in (np.nan_to_num(prompt), np.where(np.isnan(prompt), ms, 0.0), ms))
        first = (reqs["sent_s"] + reqs["ttft_ms"] / 1e3).to_numpy(float)
        last = (reqs["sent_s"] + reqs["e2e_ms"] / 1e3).to_numpy(float)
        i, j = np.searchsorted(t, first, side="right"), np.searchsorted(t, last, side="right")
        stalls, unpriced, ridden = pre[j] - pre[i], miss[j] - miss[i], tot[j] - tot[i]
        queue = reqs["queue_ms"].to_numpy(float)
        own = reqs["ttft_ms"].to_numpy(float) - queue
        e2e = reqs["e2e_ms"].to_numpy(float)
        rows.append(pd.DataFrame({
            "mode": key[0], "rate": key[1], "repeat": key[2], "request_index": reqs["request_index"].to_numpy(),
            "e2e_ms": e2e, "queue": queue, "own_prefill": own, "prefill_stalls": stalls,
            "decode_steps": ridden - stalls - unpriced, "unpriced": unpriced,
            "residual": e2e - queue - own - ridden}))
    cols = [*keys, "request_index", "e2e_ms", *PARTS]
    return pd.concat(rows, ignore_index=True) if rows else pd.DataFrame(columns=cols)


def request_parts(requests: pd.DataFrame, iterations: pd.DataFrame, coef: np.ndarray) -> pd.DataFrame:
    """``priced_parts`` with the stalls priced by the step-cost fit ``coef`` (nothing unpriced)."""
    steps = iterations[iterations["timing"].isin(engine_fit.PER_STEP)].copy()
    steps["prompt_ms"] = prefill_ms(steps, coef)
    return priced_parts(requests, steps)


def model_free_parts(requests: pd.DataFrame, iterations: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(``priced_parts`` with the stalls priced by each step's excess, ``step_excess``'s checks)."""
    steps, checks = step_excess.excess(iterations)
    return priced_parts(requests, steps), checks


def _split(rows: np.ndarray) -> np.ndarray:
    """[gain, each part's points] of paired rows [arm e2e, arm parts..., baseline e2e, baseline parts...]."""
    n = len(PARTS) + 1
    a, b = rows[:, :n].mean(axis=0), rows[:, n:].mean(axis=0)
    if not b[0] > 0:
        return np.full(n, math.nan)
    return (b - a) / b[0]


def gain_split(parts: pd.DataFrame, arm: str = "on", baseline: str = "off") -> pd.DataFrame:
    """Per rate both arms ran, over the requests counted in both (same repeat and request index): each
    arm's mean of every part (``<arm>_<part>_ms``), the gain of mean E2E and each part's points of it,
    (baseline part - arm part) / baseline mean E2E, which add up to the gain; each with ``_lo`` and
    ``_hi``, its 95 % interval over the repeats (``over_repeats``)."""
    cols = ["e2e_ms", *PARTS]
    a, b = parts[parts["mode"] == arm], parts[parts["mode"] == baseline]
    p = a.merge(b, on=["rate", "repeat", "request_index"], suffixes=("_a", "_b"))
    names = ["gain"] + [f"{x}_points" for x in PARTS]
    out = []
    for rate, g in p.groupby("rate", sort=True):
        runs = [r.sort_values("request_index")[[f"{c}_{s}" for s in "ab" for c in cols]].to_numpy(float)
                for _, r in g.groupby("repeat", sort=True)]
        est, lo, hi = over_repeats(runs, _split, seed=rate_seed(rate))
        hi[0] = min(hi[0], 1.0)  # a gain is at most 1 (the headline cuts its interval there too)
        row = {"rate": rate, "n_pairs": len(g)}
        for k, name in enumerate(names):
            row[name], row[f"{name}_lo"], row[f"{name}_hi"] = est[k], lo[k], hi[k]
        for x in PARTS:
            row[f"{arm}_{x}_ms"], row[f"{baseline}_{x}_ms"] = g[f"{x}_a"].mean(), g[f"{x}_b"].mean()
        out.append(row)
    order = ["rate", "n_pairs"] + [f"{n}{s}" for n in names for s in ("", "_lo", "_hi")]
    return pd.DataFrame(out, columns=order + [f"{m}_{x}_ms" for x in PARTS for m in (arm, baseline)])


def both(requests: pd.DataFrame, iterations: pd.DataFrame, coef: np.ndarray | None, arm: str = "on",
         baseline: str = "off") -> tuple[pd.DataFrame, pd.DataFrame]:
    """(``gain_split`` of each measure, one row per rate and ``measure``; ``step_excess``'s checks).
    ``broken_series``: the rate's engine series whose steps broke ``step_excess``'s invariant (their
    mixed steps are unpriced).  Without a fit (``coef`` None) the model-free measure alone."""
    free, checks = model_free_parts(requests, iterations)
    tables = [gain_split(free, arm, baseline).assign(measure="model-free")]
    if coef is not None:
        tables.insert(0, gain_split(request_parts(requests, iterations, coef), arm, baseline).assign(measure="fitted"))
    out = pd.concat(tables, ignore_index=True)
    broken = checks[~checks["ok"].astype(bool)].groupby("rate").size() if len(checks) else pd.Series(dtype=int)
    out["broken_series"] = [int(broken.get(r, 0)) if m == "model-free" else 0 for r, m in zip(out["rate"], out["measure"],
                                                                                              strict=True)]
    out["measure"] = pd.Categorical(out["measure"], MEASURES, ordered=True)
    out = out.sort_values(["rate", "measure"], kind="stable").reset_index(drop=True)
    out["measure"] = out["measure"].astype(str)
    return out[["rate", "measure", *(c for c in out if c not in ("rate", "measure"))]], checks
