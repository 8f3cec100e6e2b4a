"""Grids for tests: a config with one more engine axis, run through the one sweep loop."""

from __future__ import annotations

from pathlib import Path

from prefixstudy.sweep.run_sweep import run_sweep


def capacity_sweep(cfg, unit: str, values: list[float], parent: Path | None = None) -> Path:
    """``cfg`` at each capacity (``grid: {capacity.<unit>: values}``, the outermost axis), as
    ``prefixstudy capacity --capacity unit=...`` runs it; returns the sweep's parent folder."""
    cfg = cfg.model_copy(deep=True)
    cfg.grid = {f"capacity.{unit}": values, **cfg.grid}
    return run_sweep(cfg, run_dir=parent, progress=False)
