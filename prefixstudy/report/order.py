"""The report's "Arm order": metrics.order for every arm against its baseline (arms.csv's pairs)."""

from __future__ import annotations

import pandas as pd

from prefixstudy.config.arms import arm_label
from prefixstudy.metrics.order import order_effect

TEXT = ("The arms took turns point by point, and each rate's repeats alternated which went first. At the rates "
        "where both kept up in every repeat and both orders ran: the gain of mean E2E over the repeats where the "
        "baseline went first and over those where the arm did, the difference in points, and each arm's mean "
        "E2E when it went first over when it went second. A difference as large as the gain's interval would "
        "mean the order, not the cache, moved the result.")


def table(study) -> pd.DataFrame:
    """One row per arm and compared rate; empty when no rate ran in both orders."""
    pairs = study.arms[["arm", "baseline"]].drop_duplicates() if len(study.arms) else pd.DataFrame()
    points = study.manifest.get("points") or []
    rows = []
    for p in pairs.itertuples():
        e = order_effect(points, study.summary, str(p.arm), str(p.baseline))
        for r in e.itertuples():
            rows.append({"arm / baseline": f"{arm_label(p.arm)} / {arm_label(p.baseline)}", "rate (req/s)": f"{r.rate:g}",
                         "repeats: baseline first / arm first": f"{r.n_baseline_first} / {r.n_arm_first}",
                         "gain, baseline first": f"{100 * r.gain_baseline_first:.1f} %",
                         "gain, arm first": f"{100 * r.gain_arm_first:.1f} %",
                         "difference (points)": f"{r.difference_points:+.1f}",
                         "arm first / second": f"{100 * r.arm_first_over_second:+.1f} %",
                         "baseline first / second": f"{100 * r.baseline_first_over_second:+.1f} %"})
    return pd.DataFrame(rows)
