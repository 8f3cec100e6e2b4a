"""Where caching's gain comes from, request by request.

Each counted request's E2E is split, on the clocks that measured it, into

* **queue**: the engine's queue stamp (``queue_ms``), waiting for admission;
* **own prefill**: the rest of its TTFT, its own prompt's work and the step that carried it;
* **prefill stalls**: in the engine steps that ran while it decoded (those that ended between its
  first and last token, on the host's monotonic clock that both the client and the engine core
  read), the time the step-cost fit prices for the prompt tokens other requests computed there
  (``engine_fit``'s prefill part of a step: per prompt token, per prefilling request, per context
  token of a prefill).  A prompt chunk co-batched with a decode makes that token late: this is
  where another request's prefill reaches into this one's latency;
* **decode steps**: the rest of those steps' time, the decode work of the batch it rode in (larger
  when more requests are in flight) and the per-step overhead;
* **residual**: its E2E less the four, the time between its tokens that no step it rode in holds
  (output processing, the token's trip to the client, idle gaps).

Per arm and rate the parts' means add up to the mean E2E exactly (the residual closes it), so
(OFF - ON) / OFF of each part adds up to the measured gain of mean E2E: the split says how much of
the gain each part is, and the residual says how much the step records leave unexplained.

Pure: requests, iterations and the fit's coefficients in, a table out.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from prefixstudy.costmodel import engine_fit
from prefixstudy.metrics.requests import counted

PARTS = ("queue", "own_prefill", "prefill_stalls", "decode_steps", "residual")


def prefill_ms(steps: pd.DataFrame, coef: np.ndarray) -> np.ndarray:
    """Each step's fitted prompt work, ms: b per prompt token, e per prefilling request, k per context
    token of a prefill (the prompt tokens and the cached ones they attend)."""
    a, b, e, c, k = (float(x) for x in coef)
    return (b * steps["prefill_tokens"].to_numpy(float) + e * steps["num_prefill_reqs"].to_numpy(float)
            + k * (steps["prefill_tokens"].to_numpy(float) + steps["cached_tokens"].to_numpy(float)))


def request_parts(requests: pd.DataFrame, iterations: pd.DataFrame, coef: np.ndarray) -> pd.DataFrame:
    """One row per counted request that has engine stamps and steps in its point: its key, e2e_ms and
    the ``PARTS`` in ms (they add up to e2e_ms)."""
    ok = counted(requests)
    ok = ok[ok["queue_ms"].notna() & ok["ttft_ms"].notna()]
    keys = ["mode", "rate", "repeat"]
    steps = iterations[iterations["timing"].isin(engine_fit.PER_STEP)]
    by_point = dict(iter(steps.sort_values("t_s").groupby(keys, sort=False)))
    rows = []
    for key, reqs in ok.groupby(keys, sort=True):
        st = by_point.get(key)
        if st is None:
            continue
        t = st["t_s"].to_numpy(float)
        pre = np.concatenate([[0.0], np.cumsum(prefill_ms(st, coef))])
        tot = np.concatenate([[0.0], np.cumsum(st["step_ms"].to_numpy(float))])
        first = (reqs["sent_s"] + reqs["ttft_ms"] / 1e3).to_numpy(float)
        last = (reqs["sent_s"] + reqs["e2e_ms"] / 1e3).to_numpy(float)
        i, j = np.searchsorted(t, first, side="right"), np.searchsorted(t, last, side="right")
        stalls, ridden = pre[j] - pre[i], tot[j] - tot[i]
        queue = reqs["queue_ms"].to_numpy(float)
        own = reqs["ttft_ms"].to_numpy(float) - queue
        e2e = reqs["e2e_ms"].to_numpy(float)
        rows.append(pd.DataFrame({
            "mode": key[0], "rate": key[1], "repeat": key[2], "request_index": reqs["request_index"].to_numpy(),
            "e2e_ms": e2e, "queue": queue, "own_prefill": own, "prefill_stalls": stalls,
            "decode_steps": ridden - stalls, "residual": e2e - queue - own - ridden}))
    return pd.concat(rows, ignore_index=True) if rows else pd.DataFrame(columns=[*keys, "e2e_ms", *PARTS])


def gain_split(parts: pd.DataFrame, arm: str = "on", baseline: str = "off") -> pd.DataFrame:
    """Per rate both arms ran: each arm's mean of every part (``<arm>_<part>_ms``, pooled over the
    repeats' requests), the gain of mean E2E and each part's points of it, (baseline part - arm
    part) / baseline mean E2E, which add up to the gain."""
    out = []
    for rate, g in parts.groupby("rate", sort=True):
        a, b = g[g["mode"] == arm], g[g["mode"] == baseline]
        if a.empty or b.empty:
            continue
        base = b["e2e_ms"].mean()
        row = {"rate": rate, "gain": (base - a["e2e_ms"].mean()) / base}
        for p in PARTS:
            row[f"{arm}_{p}_ms"], row[f"{baseline}_{p}_ms"] = a[p].mean(), b[p].mean()
            row[f"{p}_points"] = (b[p].mean() - a[p].mean()) / base
        out.append(row)
    cols = ["rate", "gain"] + [f"{m}_{p}_ms" for p in PARTS for m in (arm, baseline)] + [f"{p}_points" for p in PARTS]
    return pd.DataFrame(out, columns=cols)
