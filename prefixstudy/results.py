"""Stage: results.  Fixed paths, atomic writes after every point, and loading back.

Layout of one run, ``<out>/<study>/<run-id>/``::

    config.yaml          the fully resolved StudyConfig
    manifest.json        versions, device, times, status of every point
    requests.parquet     schema.REQUEST_COLUMNS, all finished points
    iterations.parquet   schema.ITERATION_COLUMNS, all finished points
    summary.csv          schema.SUMMARY_COLUMNS, one row per mode x rate
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from prefixstudy.errors import UserError
from prefixstudy.schema import ITERATION_COLUMNS, REQUEST_COLUMNS, SUMMARY_COLUMNS

CONFIG = "config.yaml"
MANIFEST = "manifest.json"
REQUESTS = "requests.parquet"
ITERATIONS = "iterations.parquet"
SUMMARY = "summary.csv"


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write to a temp file in the same folder, fsync, then rename over ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


_DEFAULTS = {"str": "", "bool": False, "int64": 0, "float64": float("nan")}


def _typed(df: pd.DataFrame, columns: dict[str, str]) -> pd.DataFrame:
    """Columns in schema order and dtype; a missing column gets its default; empty frames keep every column."""
    out = pd.DataFrame(index=df.index)
    for c, t in columns.items():
        col = df[c] if c in df else pd.Series(_DEFAULTS[t], index=df.index)
        out[c] = col.fillna("").astype(str) if t == "str" else col.astype(t)
    return out.reset_index(drop=True)


def typed_requests(df: pd.DataFrame) -> pd.DataFrame:
    return _typed(df, REQUEST_COLUMNS)


def typed_iterations(df: pd.DataFrame) -> pd.DataFrame:
    return _typed(df, ITERATION_COLUMNS)


def atomic_write_parquet(path: Path, df: pd.DataFrame) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        df.to_parquet(tmp, index=False)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_csv(path: Path, df: pd.DataFrame) -> None:
    atomic_write_text(path, df.to_csv(index=False))


def write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, default=str) + "\n")


@dataclass
class StudyResults:
    """One run's results, for notebooks and for the report."""

    path: Path
    config: dict
    manifest: dict
    requests: pd.DataFrame
    iterations: pd.DataFrame
    summary: pd.DataFrame
    extra: dict = field(default_factory=dict)

    @property
    def measured(self) -> pd.DataFrame:
        """Requests that count: not warm-up."""
        return self.requests[~self.requests["warmup"]]


def find_run_dir(path: Path) -> Path:
    """Accept a run folder, or a study folder holding runs (the newest is taken)."""
    path = Path(path)
    if (path / MANIFEST).is_file():
        return path
    if path.is_dir():
        runs = sorted(p for p in path.iterdir() if (p / MANIFEST).is_file())
        if runs:
            return runs[-1]
    if not path.exists():
        raise UserError(f"{path}: results folder not found")
    raise UserError(f"{path}: no {MANIFEST} here or in a sub-folder; not a prefixstudy results folder")


def read_summary(path: Path) -> pd.DataFrame:
    if not path.is_file():
        return pd.DataFrame(columns=SUMMARY_COLUMNS)
    # An empty error field must stay "", not become NaN.
    return pd.read_csv(path, converters={"error": str, "status": str, "mode": str})


def load(path: str | Path) -> StudyResults:
    run = find_run_dir(Path(path))
    try:
        manifest = json.loads((run / MANIFEST).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{run / MANIFEST}: unreadable manifest ({e})") from None
    config = yaml.safe_load((run / CONFIG).read_text()) if (run / CONFIG).is_file() else {}
    req = pd.read_parquet(run / REQUESTS) if (run / REQUESTS).is_file() else pd.DataFrame()
    it = pd.read_parquet(run / ITERATIONS) if (run / ITERATIONS).is_file() else pd.DataFrame()
    summ = read_summary(run / SUMMARY)
    return StudyResults(run, config or {}, manifest, typed_requests(req), typed_iterations(it), summ)
