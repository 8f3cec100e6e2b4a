"""Join runs of one study made apart (caching ON and OFF side by side, one GPU or one machine
each) into one run folder, as if one run had made them; and capacity sweeps made apart
(parents with a capacity axis) into one capacity sweep, capacity by capacity."""

from __future__ import annotations

import shutil
from pathlib import Path

from prefixstudy.config import flat_config, load_config, parse_config
from prefixstudy.errors import UserError
from prefixstudy.results import find_run_dir, load
from prefixstudy.results.store import CONFIG
from prefixstudy.results.writer import ResultsWriter, new_run_dir, preflight_out
from prefixstudy.schema import PointResult, point_key


def merge_runs(run_dirs: list[Path], out: Path, run_dir: Path | None = None) -> Path:
    """Join runs of one study made apart (e.g. caching ON and OFF side by side, one GPU or one
    machine each) into one run folder (``run_dir``, default a new one under ``out``).  Their configs
    must agree on everything but the modes."""
    runs = [load(find_run_dir(d)) for d in run_dirs]
    if len(runs) < 2:
        raise UserError("merge: give at least two run folders")
    base = flat_config(runs[0].config)
    modes: list[str] = []
    for r in runs:
        flat = flat_config(r.config)
        diff = sorted(k for k in base.keys() | flat.keys()
                      if k not in ("sweep.modes", "sweep.only_repeats", "out") and base.get(k) != flat.get(k))
        if diff:
            raise UserError(f"{r.path}: config differs from {runs[0].path} at field '{diff[0]}'; "
                            "only runs of one study can be merged")
        modes += [m for m in r.config.get("sweep", {}).get("modes", []) if m not in modes]
    seen = [point_key(p) for r in runs for p in r.manifest.get("points", [])]
    if len(seen) != len(set(seen)):
        raise UserError("merge: two runs hold the same point (mode, rate and repeat); merge runs of different "
                        "modes or repeats")
    data = dict(runs[0].config)
    data["sweep"] = {**data.get("sweep", {}), "modes": sorted(modes, key=lambda m: ("on", "off", m).index(m)),
                     "only_repeats": None}
    cfg = parse_config(data, str(runs[0].path / CONFIG))
    manifest = dict(runs[0].manifest)
    manifest.update(
        started_at=min(r.manifest.get("started_at") or "" for r in runs),
        ended_at=max(r.manifest.get("ended_at") or "" for r in runs),
        status="complete" if all(r.manifest.get("status") == "complete" for r in runs) else "complete_with_failures",
        merged_from=[{"run": str(r.path), "modes": r.config.get("sweep", {}).get("modes"),
                      "device": r.manifest.get("device"), "executor": r.manifest.get("executor"),
                      "started_at": r.manifest.get("started_at"), "status": r.manifest.get("status")} for r in runs],
    )
    run_dir = run_dir or new_run_dir(cfg, out)
    preflight_out(run_dir)
    writer = ResultsWriter(run_dir, cfg, manifest)
    writer.start()
    for r in runs:
        for p in r.manifest.get("points", []):
            key = point_key(p)
            meta = {k: v for k, v in p.items() if k not in ("mode", "rate", "repeat")}
            writer.add(PointResult(key[0], key[1], _at(r.requests, key), _at(r.iterations, key), meta, key[2]))
    writer.finish()
    return run_dir


def _at(df, key: tuple[str, float, int]):
    return df[(df["mode"] == key[0]) & (df["rate"] == key[1]) & (df["repeat"] == key[2])]


def merge_capacity(parents: list[Path], out: Path) -> Path:
    """Join capacity sweeps made apart (e.g. ON on one GPU, OFF on another; or some capacities
    on one machine, the rest on another) into one sweep folder under ``out``: each capacity's runs
    are merged as ``merge_runs`` does, a capacity only one sweep ran is copied.  Only the cells a
    sweep's index lists as finished count: a capacity cut off mid-run is left out.  A sweep of
    several routing policies joins capacity by capacity and policy by policy."""
    from prefixstudy.results.sweep_folder import CAPACITY, POLICY, axis_values, read_index, write_index

    indexes = [read_index(p) for p in parents]
    axes = [axis_values(ix, CAPACITY) for ix in indexes]
    if any(a is None for a in axes):
        raise UserError(f"merge: {parents[axes.index(None)]} is no capacity sweep")
    names = {a[0] for a in axes}
    if len(names) > 1:
        raise UserError(f"merge: capacity sweeps in different units ({', '.join(sorted(n[len(CAPACITY):] for n in names))})")
    axis = names.pop()
    by_value: dict[tuple[float, str], list[tuple[Path, dict]]] = {}  # per capacity and routing policy
    for p, ix in zip(parents, indexes, strict=True):
        for r in ix["cells"]:
            if r.get("status", "complete").startswith("complete"):  # a cell cut off mid-run is left out
                by_value.setdefault((float(r["values"][axis]), r["values"].get(POLICY, "")), []).append((p / r["dir"], r))
    if not by_value:
        raise UserError("merge: the capacity sweeps hold no finished capacity")
    first = by_value[next(iter(by_value))][0][0]
    dest = new_run_dir(load_config(first / CONFIG), out)
    preflight_out(dest)
    index: dict = {"axes": {axis: sorted({v for v, _ in by_value})}, "cells": [],
                   "merged_from": [str(p) for p in parents]}
    policies = sorted({p for _, p in by_value if p})
    if policies:
        index["axes"][POLICY] = policies
    for v in sorted(by_value):
        runs = by_value[v]
        target = dest / runs[0][0].name
        if len(runs) > 1:
            merge_runs([d for d, _ in runs], out, run_dir=target)
        else:
            shutil.copytree(runs[0][0], target)
        index["cells"].append({**runs[0][1], "dir": target.name})
    write_index(dest, index)
    return dest
