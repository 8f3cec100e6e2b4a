"""Routing policies as an engine axis of a grid (``replicas`` > 1 with ``router.policies``): one
ordinary run folder per policy under one parent (``sweep.run_sweep``), and the tables and report that
read them together.

Why one run per policy and not a policy column in the point key: every piece keyed on (mode,
rate, repeat) (store part names, resume, merge, summary, headline, report) stays as it is, old
results load unchanged, and each policy's folder is a complete study of its own (its report, its
``--resume``).  The cost is one fleet start per policy; capacity sweeps (``prefixstudy.sweep.capacity_axis``)
made the same choice.  ``routing.md`` at the parent then compares policies x ON/OFF at each rate.

The parent holds ``sweep.json`` (the policies and their folders) and, once read, ``routing.csv``
(``metrics.replicas.policy_table``), ``replicas.csv`` (per replica and repeat), ``replicas_summary.csv``
(per replica over its repeats, ``replica_summary``), and ``routing.md`` / ``routing.html`` with their
figures under ``plots/`` (``report.routing.routing_report``).
"""

from __future__ import annotations

import logging
from pathlib import Path

import pandas as pd

from prefixstudy.config import StudyConfig
from prefixstudy.errors import UserError
from prefixstudy.results.sweep_folder import POLICY, read_index

# The parent's tables and their columns (metrics.replicas: ROUTING_FIELDS, REPLICAS_FIELDS,
# REPLICAS_SUMMARY_FIELDS).
ROUTING, REPLICAS, REPLICAS_SUMMARY = "routing.csv", "replicas.csv", "replicas_summary.csv"
log = logging.getLogger(__name__)


def policy_config(cfg: StudyConfig, policy: str) -> StudyConfig | None:
    """``cfg`` for one policy; None when none of its modes runs under it (an arm without caching,
    OFF by default, outside ``router.off_policies``, and no other mode)."""
    sub = cfg.model_copy(deep=True)
    sub.router.policies = [policy]
    off = cfg.router.off_policies
    sub.router.off_policies = None
    sub.sweep.modes = [m for m in cfg.sweep.modes if cfg.arm(m).prefix_caching or off is None or policy in off]
    return sub if sub.sweep.modes else None


def read_sweep(parent: Path) -> dict[str, tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]]:
    """Each routing policy's requests, steps and summary, from a sweep whose only axis is the policy."""
    from prefixstudy.results import load
    from prefixstudy.results.store import MANIFEST

    index = read_index(parent)
    if list(index["axes"]) != [POLICY]:
        raise UserError(f"{parent}: not a routing sweep folder (its axes: {', '.join(index['axes']) or 'none'})")
    out = {}
    for r in index["cells"]:
        if not (parent / r["dir"] / MANIFEST).is_file():
            continue  # stopped before this policy's run began: nothing of it to read yet
        res = load(parent / r["dir"])
        out[r["values"][POLICY]] = (res.requests, res.iterations, res.summary)
    return out
