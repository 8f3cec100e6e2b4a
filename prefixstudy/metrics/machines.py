"""The machines a rate's repeats ran on.  An interval over repeats holds for the machines they ran
on: repeats split across two machines mix two populations, and the t interval cannot say so.  So
headline.csv counts a mode's machines at each rate and gives the spread between their means.

A machine is its host, its boot (the kernel's boot id: two leases of one host name differ) and the
engine's GPU (its UUID), from summary.csv's machine columns (schema.MACHINE_FIELDS); a part not
known is "".  The recording's invariants (``machine_problems``): a GPU UUID names one GPU kind, a
named UUID comes with its GPU's name, and a boot id belongs to one host.
"""

from __future__ import annotations

import math

import pandas as pd

from prefixstudy.schema import MACHINE_COLUMNS

IDENTITY = ["host", "boot_id", "gpu_uuid"]


def _text(summary: pd.DataFrame) -> pd.DataFrame:
    """The machine columns as text, "" where absent (a summary written before them)."""
    return pd.DataFrame({c: summary[c].fillna("").astype(str) if c in summary else "" for c in MACHINE_COLUMNS},
                        index=summary.index)


def machine_ids(summary: pd.DataFrame) -> pd.Series:
    """Each row's machine as one string (host, boot id and GPU UUID joined by "/")."""
    t = _text(summary)
    return t[IDENTITY].agg("/".join, axis=1) if len(t) else pd.Series([], dtype=object, index=summary.index)


def machine_spread(requests: pd.DataFrame, summary: pd.DataFrame, modes: tuple[str, ...]) -> dict:
    """headline.csv's ``{mode}_machines`` for each of ``modes``, then their ``{mode}_machine_spread_pct``,
    at one rate.

    ``requests``: the rate's counted requests (mode, repeat, e2e_ms); ``summary``: its summary.csv
    rows.  A machine's mean is the mean E2E over the counted requests of its repeats; the spread is
    (max - min) / mean of those means, in %, NaN on one machine."""
    n, pct = {}, {}
    for mode in modes:
        rows = summary[summary["mode"] == mode]
        at = dict(zip(rows["repeat"].astype(int), machine_ids(rows), strict=True))
        m = requests[requests["mode"] == mode]
        means = m.groupby(m["repeat"].astype(int).map(at))["e2e_ms"].mean()  # NaN machine (no row): dropped
        n[f"{mode}_machines"] = int(len(means))
        pct[f"{mode}_machine_spread_pct"] = (float((means.max() - means.min()) / means.mean() * 100)
                                             if len(means) > 1 else math.nan)
    return n | pct


def machine_problems(summary: pd.DataFrame) -> list[str]:
    """Where summary.csv's machine columns contradict themselves, one line each ([] when they do not)."""
    t = _text(summary)
    out = []
    for _, r in t[(t["gpu_uuid"] != "") & (t["gpu_name"] == "")].drop_duplicates("gpu_uuid").iterrows():
        out.append(f"GPU {r['gpu_uuid']} has no name")
    named = t[(t["gpu_uuid"] != "") & (t["gpu_name"] != "")].groupby("gpu_uuid")["gpu_name"].unique()
    out += [f"GPU {u} is named {' and '.join(sorted(n))}" for u, n in named.items() if len(n) > 1]
    hosts = t[t["boot_id"] != ""].groupby("boot_id")["host"].unique()
    out += [f"boot {b} is on hosts {' and '.join(sorted(h))}" for b, h in hosts.items() if len(h) > 1]
    return out
