"""``run_sweep``: what every command that runs engines calls (``prefixstudy run``, ``capacity``,
``simulate``).  A grid of one cell is an ordinary run folder; a larger one is a parent folder
whose cells are run folders, in the grid's order, under one index (``results.sweep_folder``).

Every cell's config is built and checked before the parent folder is made, so a refused sweep
leaves nothing behind.  A sweep resumes as a run does (``--resume PARENT``): cells that finished
are kept, a cell with missing or failed points is resumed, a cell never started is started.  A cell
that fails is recorded in the index and the next cell runs; the caller reads the cells' statuses.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
from dataclasses import dataclass
from pathlib import Path

from prefixstudy.config import StudyConfig, dump_config, load_config
from prefixstudy.errors import StudyFailed, UserError, first_line
from prefixstudy.sweep.axes import Axis, grid_axes
from prefixstudy.results.sweep_folder import is_sweep, read_index, write_index

log = logging.getLogger(__name__)
CONFIG, MANIFEST = "config.yaml", "manifest.json"


@dataclass
class Cell:
    """One engine configuration of the grid: its axis values, its config and its folder's name."""

    values: dict
    cfg: StudyConfig
    dir: str


def cells(cfg: StudyConfig, axes: list[Axis]) -> list[Cell]:
    """Every combination of the axes' values, the first axis outermost; a combination that runs
    no arm (an OFF-only fleet outside ``router.off_policies``) is left out."""
    out = []
    for combo in itertools.product(*(axis.values for axis in axes)):
        sub = cfg
        for axis, value in zip(axes, combo, strict=True):
            sub = axis.apply(sub, value)
            if sub is None:
                break
        if sub is None:
            continue
        sub = sub.model_copy(deep=True)
        sub.grid = {}  # a cell is an ordinary run of its own
        out.append(Cell({a.name: v for a, v in zip(axes, combo, strict=True)}, sub,
                        "-".join(a.folder(v) for a, v in zip(axes, combo, strict=True))))
    if not out:
        raise UserError("field 'grid': no cell of the grid runs an arm")
    return out


def run_sweep(cfg: StudyConfig | None, progress: bool = True, resume: Path | str | None = None,
              resume_config: Path | str | None = None, run_dir: Path | str | None = None) -> Path:
    """Run the grid of ``cfg`` (or, with ``resume``, go on with a recorded run or sweep); returns
    the run folder, or the sweep's parent folder."""
    from prefixstudy.study.orchestrate import run_study

    resume, resume_config, run_dir = (None if p is None else Path(p) for p in (resume, resume_config, run_dir))
    if resume is not None and is_sweep(resume):
        if resume_config is not None:
            raise UserError(f"{resume}: a sweep resumes with its recorded config.yaml; drop the config")
        if not (resume / CONFIG).is_file():
            raise UserError(f"{resume}: no {CONFIG} beside its sweep index, so there is no recorded config to "
                            "resume with; resume each cell's run folder instead")
        return _run_cells(load_config(resume / CONFIG), resume, progress, resumed=True)
    if resume is not None:
        return run_study(None, progress=progress, resume=resume, resume_config=resume_config)
    if not grid_axes(cfg):
        return run_study(cfg, run_dir=run_dir, progress=progress)
    return _run_cells(cfg, run_dir, progress, resumed=False)


def _run_cells(cfg: StudyConfig, parent: Path | None, progress: bool, resumed: bool) -> Path:
    from prefixstudy.study.preflight import check_inputs
    from prefixstudy.results.store import atomic_write_text
    from prefixstudy.results.writer import new_run_dir
    from prefixstudy.study.orchestrate import run_study
    from prefixstudy.workloads import load_rows

    axes = grid_axes(cfg)
    grid = cells(cfg, axes)
    for cell in grid:  # every check before the parent folder is made
        check_inputs(cell.cfg)
    rows = load_rows(cfg)
    made = None if parent is not None else new_run_dir(cfg)
    parent = parent or made
    parent.mkdir(parents=True, exist_ok=True)
    old = {c["dir"]: c for c in read_index(parent)["cells"]} if resumed else {}
    index = {"axes": {a.name: list(a.values) for a in axes},
             "cells": [{"values": c.values, "dir": c.dir, **_kept(old.get(c.dir, {}))} for c in grid]}
    try:
        if not resumed:
            atomic_write_text(parent / CONFIG, dump_config(cfg))
        write_index(parent, index)
        for cell, entry in zip(grid, index["cells"], strict=True):
            where = parent / cell.dir
            status = _status(where)
            if status == "complete":
                continue
            try:
                if status is None:
                    run_study(cell.cfg, run_dir=where, progress=progress)
                else:
                    run_study(None, progress=progress, resume=where)
            except StudyFailed as e:  # recorded in the cell's manifest; the other cells still run
                log.error("error: %s: %s", cell.dir, e)
                entry["error"] = first_line(e, limit=300)
            except KeyboardInterrupt as e:
                e.run_dir = parent  # type: ignore[attr-defined]  # the CLI's resume line names the sweep
                raise
            else:
                entry.pop("error", None)
            entry["status"] = _status(where) or "failed"
            for axis in axes:
                entry.update(axis.record(cell.cfg, rows, where))
            write_index(parent, index)
    finally:
        if made is not None and made.is_dir() and not any(p.name not in (CONFIG, "sweep.json") for p in made.iterdir()):
            for p in made.iterdir():  # stopped before a cell wrote anything: no folder to read as a sweep
                with contextlib.suppress(OSError):
                    p.unlink()
            with contextlib.suppress(OSError):  # never in place of the error that ended the sweep
                made.rmdir()
    return parent


def _kept(entry: dict) -> dict:
    return {k: v for k, v in entry.items() if k not in ("values", "dir")}


def _status(run_dir: Path) -> str | None:
    """A cell's run status from its manifest; None: never started."""
    import json

    f = run_dir / MANIFEST
    if not f.is_file():
        return None
    try:
        return json.loads(f.read_text()).get("status") or "running"
    except (OSError, ValueError):
        return "failed"


