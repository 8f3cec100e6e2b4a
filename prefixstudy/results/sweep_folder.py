"""A sweep's parent folder: ``config.yaml`` (the resolved config, its ``grid`` included) and
``sweep.json``, the one index of its cells, replaced whole on every change so a reader never sees
half of it:

    {"axes": {"capacity.blocks": [16, 12], "router.policy": ["round_robin"]},
     "cells": [{"values": {"capacity.blocks": 16, "router.policy": "round_robin"},
                "dir": "blocks-16-policy-round_robin", "status": "complete", ...}, ...]}

A cell's entry may carry what its axis records beside the run (a capacity's working set).  Sweeps
written before this index had one per kind of sweep (``capacity.json``, ``routing.json``); they
are read as the same structure.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from prefixstudy.errors import UserError
from prefixstudy.results.store import atomic_write_text

INDEX = "sweep.json"
# Axes the sweep's reports read by name: capacity.<unit>, a fleet's routing policy, the share of a
# fixed prompt that is common to every request.
CAPACITY, POLICY, SHARED = "capacity.", "router.policy", "dataset.shared_fraction"
LEGACY_CAPACITY, LEGACY_ROUTING = "capacity.json", "routing.json"


def is_sweep(path: Path) -> bool:
    path = Path(path)
    return any((path / name).is_file() for name in (INDEX, LEGACY_CAPACITY, LEGACY_ROUTING))


def write_index(parent: Path, index: dict[str, Any]) -> None:
    atomic_write_text(Path(parent) / INDEX, json.dumps(index, indent=1))


def read_index(parent: Path) -> dict[str, Any]:
    """The sweep's index as ``{"axes": {...}, "cells": [...]}``, from ``sweep.json`` or an older
    sweep's own index."""
    parent = Path(parent)
    for name, convert in ((INDEX, lambda d: d), (LEGACY_CAPACITY, _from_capacity), (LEGACY_ROUTING, _from_routing)):
        f = parent / name
        if f.is_file():
            try:
                data = json.loads(f.read_text())
            except (OSError, ValueError) as e:
                raise UserError(f"{f}: not a readable sweep index ({e})") from None
            if not isinstance(data, dict):
                raise UserError(f"{f}: not a sweep index (expected a mapping)")
            return convert(data)
    raise UserError(f"{parent}: no {INDEX} here (not a sweep folder)")


def axis_values(index: dict[str, Any], prefix: str) -> tuple[str, list] | None:
    """The first axis whose name starts with ``prefix`` (e.g. ``"capacity."``) and its values."""
    return next(((name, vals) for name, vals in index["axes"].items() if name.startswith(prefix)), None)


def _from_capacity(d: dict) -> dict:
    axis = f"capacity.{d['unit']}"
    cells = []
    for r in d.get("runs", []):
        values = {axis: r["capacity"], **({"router.policy": r["policy"]} if "policy" in r else {})}
        cells.append({"values": values, **{k: v for k, v in r.items() if k not in ("capacity", "policy")}})
    axes = {axis: d.get("values", [])}
    policies = list(dict.fromkeys(c["values"]["router.policy"] for c in cells if "router.policy" in c["values"]))
    if policies:
        axes["router.policy"] = policies
    return {"axes": axes, "cells": cells, **({"merged_from": d["merged_from"]} if "merged_from" in d else {})}


def _from_routing(d: dict) -> dict:
    cells = [{"values": {"router.policy": r["policy"]}, "dir": r["dir"]} for r in d.get("runs", [])]
    return {"axes": {"router.policy": d.get("policies", [])}, "cells": cells, "replicas": d.get("replicas")}


def cell_dirs(parent: Path) -> list[Path]:
    """The run folders of a sweep's cells that have started, in the grid's order."""
    return [Path(parent) / c["dir"] for c in read_index(parent)["cells"]
            if (Path(parent) / c["dir"] / "manifest.json").is_file()]
