"""What other requests' prompt chunks add to a step, measured without a cost model.

A step that carries prompt tokens ("mixed") runs longer than a decode-only step of the same decode
batch.  Its **excess** is its step_ms less the median decode-only step of the same decode batch
size (``decode_tokens``) in the same engine series (point, arm, replica): the time its prompt
tokens added, on that engine's own clock.  No fit prices it, so a fit that a few long steps
dominate cannot move it.

* A batch size with fewer than ``MIN_STEPS`` decode-only steps takes its baseline by linear
  interpolation between the nearest sizes on either side that have enough.  Past the sizes seen
  (no size below or above) there is no baseline: the step is **unpriced**, not extrapolated.
* Invariant: adding prompt tokens to a batch never makes the step shorter, so the median excess of
  a series' priced mixed steps is >= 0.  A series that breaks it (mixed steps shorter than the
  decode-only ones: clocks that disagree, steps in the wrong order) is flagged and all its mixed
  steps are left unpriced.

Decode-only steps have no excess (0).  Pure: iterations in, a frame out.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from prefixstudy.costmodel.engine_fit import PER_STEP, busy_steps, engine_keys

MIN_STEPS = 3  # decode-only steps a batch size needs before its median is a baseline


def baseline_ms(decode_only: pd.DataFrame, sizes: np.ndarray) -> np.ndarray:
    """The decode-only baseline (ms) at each decode batch size of ``sizes``, from one series' decode-only
    steps: the median at that size, else interpolated between the nearest sizes with enough steps;
    NaN where no size lies on one side."""
    g = decode_only.groupby("decode_tokens")["step_ms"].agg(["median", "size"])
    g = g[g["size"] >= MIN_STEPS]
    out = np.full(len(sizes), np.nan)
    if g.empty:
        return out
    x, y = g.index.to_numpy(float), g["median"].to_numpy(float)
    s = np.asarray(sizes, float)
    inside = (s >= x[0]) & (s <= x[-1])
    out[inside] = np.interp(s[inside], x, y)
    return out


def excess(iterations: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(steps, checks).  ``steps``: the per-step rows (``timing`` one step's own cost) with
    ``prompt_ms``, each step's excess (0 for a step without prompt tokens, NaN where unpriced).
    ``checks``: one row per engine series with mixed steps: of those that carry decodes (a step no
    request decodes in stalls none), ``mixed_steps``, ``unpriced_steps`` and ``unpriced_share`` (of
    their time); ``median_excess_ms`` and ``ok`` (the invariant)."""
    steps = iterations[iterations["timing"].isin(PER_STEP)].reset_index(drop=True)
    steps["prompt_ms"] = np.where(steps["prefill_tokens"].to_numpy() > 0, np.nan, 0.0)
    busy = busy_steps(steps)
    keys = engine_keys(steps)
    rows = []
    for key, g in steps.groupby(keys, sort=True):
        mixed = g[g["prefill_tokens"] > 0]
        if mixed.empty:
            continue
        b = busy.loc[busy.index.intersection(g.index)]
        base = baseline_ms(b[b["prefill_tokens"] == 0], mixed["decode_tokens"].to_numpy(float))
        ex = mixed["step_ms"].to_numpy(float) - base
        priced = np.isfinite(ex)
        decoding = priced & (mixed["decode_tokens"].to_numpy() > 0)
        med = float(np.median(ex[decoding])) if decoding.any() else np.nan
        ok = not med < 0
        if ok:
            steps.loc[mixed.index, "prompt_ms"] = ex
        rides = mixed["decode_tokens"].to_numpy() > 0  # a step no request decodes in stalls none
        unpriced = (~priced if ok else np.ones(len(mixed), bool)) & rides
        ms = np.where(rides, mixed["step_ms"].to_numpy(float), 0.0)
        rows.append({**dict(zip(keys, key if isinstance(key, tuple) else (key,), strict=True)),
                     "mixed_steps": int(rides.sum()), "unpriced_steps": int(unpriced.sum()),
                     "unpriced_share": float(ms[unpriced].sum() / ms.sum()) if ms.sum() > 0 else np.nan,
                     "median_excess_ms": med, "ok": ok})
    cols = keys + ["mixed_steps", "unpriced_steps", "unpriced_share", "median_excess_ms", "ok"]
    return steps, pd.DataFrame(rows, columns=cols)
