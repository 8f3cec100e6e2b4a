"""Interval coverage on real repeats: leave one repeat out, and check whether the others predict it.

For every calm cell of the committed GPU studies (an arm at a rate, or the gain at a rate, where no
repeat saturated) with two or more repeats, each repeat in turn is held out and the rest predict
it, three ways, at 95 %:

* **within**: the moving-block bootstrap of the points' own requests alone (``shared.bootstrap``):
  the held-out repeat's value is within 1.96 x sqrt(v_held + mean v_rest / n_rest) of the rest's
  mean, as if repeats differed only by their requests' noise;
* **within + pooled**: the same with a between-repeat variance added, pooled over the study's other
  calm cells of the same kind (their repeats' variance beyond their within-point variance);
* **t over repeats**: Student's t prediction from the rest's own spread, t(n_rest - 1) x s_rest x
  sqrt(1 + 1 / n_rest), the shipped method's, where three repeats or more leave two to spread.

An arm's value is log mean E2E (relative spread); the gain's is (OFF - ON) / OFF of mean E2E, its
within variance from the paired bootstrap (the same blocks of request indices in both arms).  The
repeats of a study span its engine restarts (a resumed run restarts the engines) and, for the
studies merged from runs apart, machines.  Writes benchmarks/results/interval_loo.json:

    python benchmarks/interval_loo.py
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "experiments" / "results"
OUT = REPO / "benchmarks" / "results" / "interval_loo.json"
STUDIES = ("h200-tp1", "h200-tp1-fixed-order", "h200-tp1-sync", "h200-multiturn-sync", "h200-offload", "h200-vllm-server")
N_BOOT = 400
Z = 1.959964


def _within(x_on: np.ndarray | None, x: np.ndarray, rng) -> tuple[float, float]:
    """(value, bootstrap variance) of one point: log mean of ``x``, or with ``x_on`` the gain 1 - on/off
    of paired rows."""
    from prefixstudy.shared.bootstrap import block_indices

    def value(idx):
        return math.log(x[idx].mean()) if x_on is None else 1 - x_on[idx].mean() / x[idx].mean()

    n = len(x)
    draws = [value(block_indices(n, rng)) for _ in range(N_BOOT)]
    return value(np.arange(n)), float(np.var(draws))


def cells(study: str) -> list[dict]:
    """Every calm cell of ``study`` with 2+ repeats: kind (an arm, or "gain"), rate, and per repeat
    the value and its within-point variance."""
    from prefixstudy.metrics.requests import counted
    from prefixstudy.results import load

    st = load(RESULTS / study)
    req, s = counted(st.requests), st.summary
    sat = {(m, float(r)) for m, r, v in zip(s["mode"], s["rate"], s["saturated"], strict=True) if bool(v)}
    rng = np.random.default_rng(0)
    out = []
    for (mode, rate), g in req.groupby(["mode", "rate"], sort=True):
        if (mode, float(rate)) in sat or g["repeat"].nunique() < 2:
            continue
        vals = [_within(None, r.sort_values("request_index")["e2e_ms"].to_numpy(float), rng)
                for _, r in g.groupby("repeat", sort=True)]
        out.append({"study": study, "kind": mode, "rate": float(rate), "values": [v for v, _ in vals],
                    "within_var": [w for _, w in vals]})
    for rate, g in req.groupby("rate", sort=True):
        if ("on", float(rate)) in sat or ("off", float(rate)) in sat or not {"on", "off"} <= set(g["mode"]):
            continue
        p = g[g["mode"] == "on"].merge(g[g["mode"] == "off"], on=["repeat", "request_index"], suffixes=("_on", "_off"))
        if p["repeat"].nunique() < 2:
            continue
        vals = [_within(r["e2e_ms_on"].to_numpy(float), r["e2e_ms_off"].to_numpy(float), rng)
                for _, r in p.sort_values("request_index").groupby("repeat", sort=True)]
        out.append({"study": study, "kind": "gain", "rate": float(rate), "values": [v for v, _ in vals],
                    "within_var": [w for _, w in vals]})
    return out


def _excess(c: dict) -> tuple[float, int]:
    """(the cell's repeats' variance beyond their mean within-point variance, its degrees of freedom)."""
    y, v = np.asarray(c["values"]), np.asarray(c["within_var"])
    return float(np.var(y, ddof=1) - v.mean()), len(y) - 1


def held_out(all_cells: list[dict]) -> pd.DataFrame:
    """One row per (cell, held-out repeat): whether each method's 95 % prediction holds it."""
    from prefixstudy.shared.bootstrap import t_quantile

    rows = []
    excess = [_excess(c) for c in all_cells]
    for c in all_cells:
        same = [e for o, e in zip(all_cells, excess, strict=True)
                if o is not c and o["study"] == c["study"] and (o["kind"] == "gain") == (c["kind"] == "gain")]
        num = sum(df * ex for ex, df in same)
        den = sum(df for _, df in same)
        tau2 = max(0.0, num / den) if den else 0.0
        y, v = np.asarray(c["values"]), np.asarray(c["within_var"])
        for j in range(len(y)):
            rest, vr = np.delete(y, j), np.delete(v, j)
            n = len(rest)
            err = abs(y[j] - rest.mean())
            row = {"study": c["study"], "kind": c["kind"], "rate": c["rate"], "repeat": j, "n_rest": n,
                   "error": float(err),
                   "within": bool(err <= Z * math.sqrt(v[j] + vr.mean() / n)),
                   "within_pooled": bool(err <= Z * math.sqrt(v[j] + tau2 + (vr.mean() + tau2) / n)),
                   "t_repeats": (bool(err <= t_quantile(0.975, n - 1) * rest.std(ddof=1) * math.sqrt(1 + 1 / n))
                                 if n >= 2 else None)}
            rows.append(row)
    return pd.DataFrame(rows)


def summary(rows: pd.DataFrame) -> dict:
    out = {}
    for m in ("within", "within_pooled", "t_repeats"):
        r = rows[rows[m].notna()]
        out[m] = {"held_out": int(len(r)), "covered": int(r[m].astype(bool).sum())}
    return out


def main() -> None:
    rows = held_out([c for s in STUDIES for c in cells(s)])
    OUT.write_text(json.dumps({"studies": list(STUDIES), "n_boot": N_BOOT, "summary": summary(rows),
                               "rows": rows.to_dict("records")}, indent=1) + "\n")
    print(json.dumps(summary(rows)))


if __name__ == "__main__":
    main()
