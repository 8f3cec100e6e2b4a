"""Routing policies as an outer sweep axis: one ordinary run folder per policy under one parent,
and the tables and report that read them together.

Why one run per policy and not a policy column in the point key: every piece keyed on (mode,
rate, repeat) (store part names, resume, merge, summary, headline, report) stays as it is, old
results load unchanged, and each policy's folder is a complete study of its own (its report, its
``--resume``).  The cost is one fleet start per policy; capacity sweeps (``prefixstudy.capacity``)
made the same choice.  ``routing.md`` at the parent then compares policies x ON/OFF at each rate.

The parent holds ``routing.json`` (the policies and their folders) and, once read, ``routing.csv``
(``metrics.replicas.policy_table``), ``replicas.csv`` (per replica and repeat), ``replicas_summary.csv``
(per replica over its repeats, ``replica_summary``), and ``routing.md`` / ``routing.html`` with their
figures under ``plots/`` (``report.routing``).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pandas as pd

from prefixstudy.config import StudyConfig
from prefixstudy.errors import UserError
from prefixstudy.metrics import replicas as rm
from prefixstudy.schema import typed_frame

INDEX = "routing.json"
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


def run_routing_sweep(cfg: StudyConfig | None, parent: Path | None = None, progress: bool = True,
                      resume: Path | None = None) -> Path:
    """One run per policy of ``cfg.router.policies``, in order, under ``parent`` (default: a new
    run folder).  A run with failed points still counts (its folder can be resumed).

    ``resume``: a parent folder made before; its recorded config is read, each policy's run is
    resumed (missing and failed points), and a policy that never started is started.  So a sweep
    stopped by Ctrl-C or a deadline goes on with one command.  KeyboardInterrupt leaves with the
    parent in ``run_dir``, for the CLI's resume line."""
    from prefixstudy.config import dump_config, load_config
    from prefixstudy.preflight import check_device, check_engine_config, check_plan
    from prefixstudy.results.store import CONFIG, MANIFEST, atomic_write_text
    from prefixstudy.results.writer import new_run_dir
    from prefixstudy.study import StudyFailed, run_study

    if resume is not None:
        parent = resume
        if not (parent / INDEX).is_file() or not (parent / CONFIG).is_file():
            raise UserError(f"{parent}: no {INDEX} and {CONFIG} here (not a routing sweep folder)")
        cfg = load_config(parent / CONFIG)
    check_plan(cfg)  # every input check before the parent folder is made
    check_device(cfg)
    check_engine_config(cfg)
    parent = parent or new_run_dir(cfg)
    parent.mkdir(parents=True, exist_ok=True)
    if resume is None:
        atomic_write_text(parent / CONFIG, dump_config(cfg))
    index: dict = {"policies": cfg.router.policies, "replicas": cfg.replicas, "runs": []}
    for policy in cfg.router.policies:
        sub = policy_config(cfg, policy)
        if sub is None:
            continue
        run_dir = parent / f"policy-{policy}"
        index["runs"].append({"policy": policy, "dir": run_dir.name})
        (parent / INDEX).write_text(json.dumps(index, indent=1))
        try:
            if (run_dir / MANIFEST).is_file():
                run_study(None, progress=progress, resume=run_dir)
            else:
                run_study(sub, run_dir=run_dir, progress=progress)
        except StudyFailed as e:  # recorded in its manifest; the other policies still run
            log.error("error: policy %s: %s", policy, e)
        except KeyboardInterrupt as e:
            e.run_dir = parent  # type: ignore[attr-defined]
            raise
    return parent


def read_sweep(parent: Path) -> dict[str, tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]]:
    from prefixstudy.results import load
    from prefixstudy.results.store import MANIFEST

    f = parent / INDEX
    if not f.is_file():
        raise UserError(f"{parent}: no {INDEX} (not a routing sweep folder)")
    out = {}
    for r in json.loads(f.read_text())["runs"]:
        if not (parent / r["dir"] / MANIFEST).is_file():
            continue  # stopped before this policy's run began: nothing of it to read yet
        res = load(parent / r["dir"])
        out[r["policy"]] = (res.requests, res.iterations, res.summary)
    return out


def routing_report(parent: Path) -> Path:
    """Writes routing.csv, replicas.csv, replicas_summary.csv, routing.md, routing.html and
    plots/routing_* at ``parent`` (``report.routing``); returns routing.md."""
    from prefixstudy.report.routing import write_routing_report

    runs = {p: v for p, v in read_sweep(parent).items() if len(v[0])}
    if not runs:  # every policy stopped before a point finished: say so rather than draw nothing
        out = parent / "routing.md"
        out.write_text("# Routing\n\nNo policy finished a point: see each policy's manifest.json (`error`).\n")
        return out
    table = rm.policy_table(runs)
    table.to_csv(parent / ROUTING, index=False)
    per = typed_frame(pd.concat([rm.replica_table(req, its).assign(policy=p) for p, (req, its, _) in runs.items()],
                                ignore_index=True), rm.REPLICAS_FIELDS)
    per.to_csv(parent / REPLICAS, index=False)
    summary = rm.replica_summary(runs)
    summary.to_csv(parent / REPLICAS_SUMMARY, index=False)
    return write_routing_report(parent, list(runs), table, per, summary)
