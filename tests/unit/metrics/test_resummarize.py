"""The committed studies, summarised again by today's code, give their committed summary.csv.

This pins the definitions (counted request, saturation, hit rate, percentiles) across refactors:
a column whose meaning changes on purpose must be listed here, with the reason.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[3]
RUNS = sorted(p.parent.name for p in (REPO / "experiments/results").glob("*/summary.csv"))


@pytest.mark.parametrize("run", RUNS)
def test_committed_summary_is_reproduced(run):
    from prefixstudy.metrics.summary import summarize

    d = REPO / "experiments/results" / run
    req = pd.read_parquet(d / "requests.parquet")
    it = pd.read_parquet(d / "iterations.parquet")
    points = json.loads((d / "manifest.json").read_text())["points"]
    committed = pd.read_csv(d / "summary.csv", converters={"error": str, "status": str, "mode": str})
    tol = 0.05
    got = summarize(req, points, tol, it)
    assert list(got.columns[:len(committed.columns)]) == list(committed.columns)  # new columns go at the end
    assert len(got) == len(committed) > 0
    for c in committed.columns:
        a, b = got[c].to_numpy(), committed[c].to_numpy()
        if a.dtype.kind in "fiu" and b.dtype.kind in "fiu":
            np.testing.assert_allclose(a.astype(float), b.astype(float), rtol=1e-9, equal_nan=True, err_msg=c)
        else:
            assert got[c].astype(object).fillna("").astype(str).tolist() == committed[c].astype(object).fillna("").astype(str).tolist(), c


def test_runs_found():
    assert RUNS == ["cpu-default", "h200-tp1", "h200-tp1-gc", "h200-tp2"]
