"""Re-derive a run folder with today's code: every point's summary.csv row (its latencies, hit rates
and saturation) from the point's own request and step records, then what needs the whole run
(``finish_run``: the step-cost fit, headline.csv, arms.csv, the manifest's derived fields), and a
capacity search's answer (capacity.csv).
``prefixstudy report RUN --rederive`` calls it before it builds the report.

What the run measured is never touched: the records, config.yaml, and each point's status, error,
requests sent and the engine's and server's own counters (read from summary.csv as the run wrote
them).  A point a policy marked failed stays failed.  A point's machine is its manifest entry's; an
older run's points get what its manifest knows (``results.machines``), recorded in their entries.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from prefixstudy.errors import UserError
from prefixstudy.metrics import capacity_search as cap
from prefixstudy.metrics.requests import KEY, with_repeat
from prefixstudy.metrics.summary import point_rows, summarize_point
from prefixstudy.results.finish import finish_run
from prefixstudy.results.machines import recorded_machine
from prefixstudy.results.store import (CONFIG, MANIFEST, REQUESTS, SUMMARY, atomic_write_csv, write_capacity_search,
                                       write_json)
from prefixstudy.schema import MACHINE_COLUMNS, SERVER_COLUMNS, SUMMARY_COLUMNS, TIER_COLUMNS, point_key

# summary.csv columns that record what the run saw rather than what is derived from the records.
KEPT = ["status", "error", "n_sent", "duration_s", *SERVER_COLUMNS, *TIER_COLUMNS]


def _meta(row: dict, point: dict, limit: int | None) -> dict:
    """summarize_point's meta for one recorded row: what the run recorded, NaN counters as None;
    the admission limit the point recorded, else ``limit`` (the config's)."""
    meta = {k: row.get(k) for k in KEY + KEPT}
    for c in (*SERVER_COLUMNS, *TIER_COLUMNS):
        v = meta.get(c)
        meta[c] = None if v is None or (isinstance(v, float) and math.isnan(v)) else v
    if not meta.get("error") or (isinstance(meta["error"], float) and math.isnan(meta["error"])):
        meta["error"] = ""
    if "prefix_caching" in point:
        meta["prefix_caching"] = point["prefix_caching"]
    meta["admission_limit"] = point.get("admission_limit", limit)
    return meta


def recorded_limit(config: dict) -> int | None:
    """The admission limit a run's config.yaml records: its engine's ``max_num_seqs`` (absent for
    engines without one) times its replicas."""
    seqs = (config.get("engine") or {}).get("max_num_seqs")
    return int(seqs) * int(config.get("replicas") or 1) if seqs else None


def _capacity_search(run_dir: Path, manifest: dict, rows: list[dict]) -> None:
    """A capacity search's answer from the re-derived verdicts (``rows``: the new summary rows):
    capacity.csv and the manifest's ``capacity_search``.  The points it ran stay as they are; only
    what they say is derived again."""
    if not manifest.get("capacity_search"):
        return
    from prefixstudy.config import load_config

    cfg = load_config(run_dir / CONFIG)
    spec = cfg.sweep.capacity_search
    found = cap.search_arms(manifest.get("points", []), {point_key(r): r for r in rows}, spec, cfg.sweep.modes)
    write_capacity_search(run_dir, manifest, spec, found, cfg.sweep.baseline_arm())


def _tolerance(config: dict) -> float:
    return float(((config.get("checks") or {}).get("hit_rate_tolerance")) or 0.05)


def rederive(run_dir: Path) -> pd.DataFrame:
    """Rewrite summary.csv, headline.csv, arms.csv and the manifest's derived fields of ``run_dir``
    from its records.  Returns the points whose saturation verdict changed: mode, rate, repeat,
    saturated_before, saturated, saturation_reason."""
    from prefixstudy.results import load

    run_dir = Path(run_dir)
    if not (run_dir / REQUESTS).exists():
        raise UserError(f"{run_dir}: no request records ({REQUESTS}/); nothing to re-derive from")
    study = load(run_dir)
    run_dir = study.path
    if study.summary.empty or study.requests.empty:
        raise UserError(f"{run_dir}: no finished point with request records; nothing to re-derive from")
    req, its = with_repeat(study.requests), with_repeat(study.iterations) if len(study.iterations) else None
    points = {(p["mode"], float(p["rate"]), int(p.get("repeat", 0))): p for p in study.manifest.get("points", [])}
    tolerance, limit = _tolerance(study.config), recorded_limit(study.config)
    rows, changed = [], []
    for old in study.summary.reindex(columns=SUMMARY_COLUMNS).to_dict("records"):
        key = (old["mode"], float(old["rate"]), int(old["repeat"]))
        point = points.get(key, {})
        meta = _meta(old, point, limit) | recorded_machine(study.manifest, {**dict(zip(KEY, key, strict=True)), **point})
        it = point_rows(its, meta) if its is not None else None
        row = summarize_point(point_rows(req, meta), meta, tolerance, it if it is not None and len(it) else None)
        rows.append(row)
        before = bool(old["saturated"]) if pd.notna(old["saturated"]) else False
        if before != bool(row["saturated"]):
            changed.append({**dict(zip(KEY, key, strict=True)), "saturated_before": before,
                            "saturated": bool(row["saturated"]), "saturation_reason": row["saturation_reason"]})
        if point:
            point["saturated"] = bool(row["saturated"]) and point.get("status", "ok") == "ok"
            point.setdefault("admission_limit", limit)  # what the check used: recorded, as a new run's
            point.update({c: meta[c] for c in MACHINE_COLUMNS})  # where it ran, as far as the manifest knows
    atomic_write_csv(run_dir / SUMMARY, pd.DataFrame(rows, columns=SUMMARY_COLUMNS))
    manifest = study.manifest
    finish_run(run_dir, manifest)
    _capacity_search(run_dir, manifest, rows)
    write_json(run_dir / MANIFEST, manifest)
    return pd.DataFrame(changed, columns=[*KEY, "saturated_before", "saturated", "saturation_reason"])
