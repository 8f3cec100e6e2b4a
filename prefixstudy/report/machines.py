"""The report's note on machines, under Per rate: where a rate's repeats ran on more than one
machine, how far apart the machines' means were (headline.csv's ``*_machines`` and
``*_machine_spread_pct``, metrics.machines), and where the recorded machines contradict themselves."""

from __future__ import annotations

import pandas as pd

from prefixstudy.config.arms import arm_label
from prefixstudy.metrics.machines import machine_problems
from prefixstudy.report.tables import fmt


def spanning(head: pd.DataFrame, arms: tuple[str, str]) -> pd.DataFrame:
    """The headline rows where either arm's repeats ran on more than one machine."""
    cols = [f"{m}_machines" for m in arms]
    if not len(head) or not set(cols) <= set(head.columns):
        return head.iloc[0:0]
    return head[(head[cols].fillna(0) > 1).any(axis=1)]


def table(rows: pd.DataFrame, arms: tuple[str, str]) -> pd.DataFrame:
    out = []
    for _, r in rows.sort_values("rate").iterrows():
        row = {"rate (req/s): actual (set)": f"{fmt(r['arrival_rate'], '.2f')} ({r['rate']:g})"}
        for m in arms:
            row[f"{arm_label(m)} machines"] = int(r[f"{m}_machines"])
            # The spread has no interval of its own: whole percent says as much as two means can.
            row[f"{arm_label(m)}: spread of their means"] = fmt(r[f"{m}_machine_spread_pct"], ".0f") + " %"
            row[f"{arm_label(m)}: spread of the repeats"] = fmt(r[f"{m}_spread_pct"], ".0f") + " %"
        out.append(row)
    return pd.DataFrame(out)


def blocks(head: pd.DataFrame, summary: pd.DataFrame, arms: tuple[str, str]) -> list[tuple]:
    """The note and its table where a rate's repeats span machines; a line per contradiction in the
    recorded machines; nothing where every rate ran on one machine."""
    b: list[tuple] = []
    rows = spanning(head, arms)
    if len(rows):
        b += [("p", f"The repeats of {len(rows)} of {len(head)} rates ran on more than one machine (host, boot and "
                    "GPU: summary.csv's machine columns). An interval over repeats holds for the machines it ran "
                    "on; where they differ it mixes them. The spread of the machines' means (max − min over "
                    "their mean E2E) is beside the repeats' own spread."),
              ("table", table(rows, arms))]
    problems = machine_problems(summary)
    if problems:
        b += [("p", "The recorded machines contradict themselves:"), ("list", problems)]
    return b
