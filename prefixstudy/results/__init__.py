"""Stage: results.  A run folder on disk (``store``: fixed paths, atomic writes), how a run is
written point by point (``writer``), where it ran (``provenance``), and loading it back here.

``load(path)`` is what notebooks, the report and the model read; it accepts a run folder or a
study folder holding runs (the newest is taken).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import yaml

from prefixstudy.errors import UserError, read_text
from prefixstudy.metrics.requests import measured
from prefixstudy.results.migrate import migrate
from prefixstudy.results.store import (ARMS, CONFIG, HEADLINE, ITERATIONS, MANIFEST, REQUESTS, SUMMARY, atomic_write_csv,
                                       atomic_write_parquet, atomic_write_text, read_table, write_json)
from prefixstudy.schema import MACHINE_COLUMNS, SUMMARY_COLUMNS, typed_iterations, typed_requests

__all__ = ["ARMS", "CONFIG", "HEADLINE", "ITERATIONS", "MANIFEST", "REQUESTS", "SUMMARY", "StudyResults", "atomic_write_csv",
           "atomic_write_parquet", "atomic_write_text", "find_run_dir", "load", "read_manifest", "read_summary", "typed_iterations",
           "typed_requests", "write_json"]


@dataclass
class StudyResults:
    """One run's results, for notebooks and for the report."""

    path: Path
    config: dict
    manifest: dict
    requests: pd.DataFrame
    iterations: pd.DataFrame
    summary: pd.DataFrame
    headline: pd.DataFrame = field(default_factory=pd.DataFrame)  # headline.csv: per rate, over repeats
    arms: pd.DataFrame = field(default_factory=pd.DataFrame)  # arms.csv: every arm vs the baseline, per rate

    @property
    def measured(self) -> pd.DataFrame:
        """The measured requests (not warm-ups), failed and unfinished ones included."""
        return measured(self.requests)


def find_run_dir(path: Path) -> Path:
    """Accept a run folder, or a study folder holding runs (the newest is taken)."""
    path = Path(path)
    if (path / MANIFEST).is_file():
        return path
    if (path / MANIFEST).is_symlink() or (path / MANIFEST).exists():  # a loop, a device, a folder
        read_text(path / MANIFEST, "manifest", "a run's manifest.json", max_bytes=MANIFEST_MAX_BYTES)
        raise UserError(f"{path / MANIFEST}: not a regular file; not a prefixstudy results folder")
    if path.is_dir():
        runs = sorted(p for p in path.iterdir() if (p / MANIFEST).is_file())
        if runs:
            return runs[-1]
    if not path.exists():
        raise UserError(f"{path}: results folder not found")
    raise UserError(f"{path}: no {MANIFEST} here or in a sub-folder; not a prefixstudy results folder")


MANIFEST_MAX_BYTES = 256 << 20  # a sweep of thousands of points is a few MiB


def read_manifest(run_dir: Path) -> dict:
    """A run's manifest.json, or one line saying why it is not one: unreadable, not an object, or
    a point without its mode and rate."""
    path = Path(run_dir) / MANIFEST
    try:
        manifest = json.loads(read_text(path, "manifest", "a run's manifest.json", max_bytes=MANIFEST_MAX_BYTES))
    except (json.JSONDecodeError, RecursionError) as e:
        raise UserError(f"{path}: unreadable manifest ({e})") from None
    if not isinstance(manifest, dict):
        raise UserError(f"{path}: not a prefixstudy manifest (not an object)")
    points = manifest.get("points", [])
    if not isinstance(points, list):
        raise UserError(f"{path}: not a prefixstudy manifest ('points' is not a list)")
    for i, p in enumerate(points):
        if not (isinstance(p, dict) and isinstance(p.get("mode"), str) and isinstance(p.get("rate"), (int, float))
                and not isinstance(p.get("rate"), bool)):
            raise UserError(f"{path}: not a prefixstudy manifest (point {i} has no mode and rate)")
    return manifest


def read_summary(path: Path) -> pd.DataFrame:
    if not path.is_file():
        return pd.DataFrame(columns=SUMMARY_COLUMNS)
    # An empty error field must stay "", not become NaN.
    try:
        df = pd.read_csv(path, converters={"error": str, "status": str, "mode": str, "saturation_reason": str})
    except pd.errors.EmptyDataError:  # an empty file holds no rows: a resume rebuilds them from the parts
        return pd.DataFrame(columns=SUMMARY_COLUMNS)
    except (pd.errors.ParserError, UnicodeDecodeError, OSError) as e:
        raise UserError(f"{path}: unreadable summary ({str(e).strip().splitlines()[0]})") from None
    for c in ("error", "status", "mode", "saturation_reason", "step_timing"):
        if c in df:  # one dtype for text, whether a column is all empty or not
            df[c] = df[c].astype(object)
    for c in MACHINE_COLUMNS:  # "" where not known (a CPU has no GPU UUID)
        if c in df:
            df[c] = df[c].astype(object).where(df[c].notna(), "").astype(str).astype(object)
    return df


def load(path: str | Path) -> StudyResults:
    run = find_run_dir(Path(path))
    manifest = read_manifest(run)
    config = {}
    if (run / CONFIG).is_file():
        try:
            config = yaml.safe_load(read_text(run / CONFIG, "config", "the run's config.yaml"))
        except (yaml.YAMLError, RecursionError) as e:
            raise UserError(f"{run / CONFIG}: unreadable recorded config ({type(e).__name__})") from None
    head = pd.read_csv(run / HEADLINE) if (run / HEADLINE).is_file() else pd.DataFrame()
    arms = pd.read_csv(run / ARMS, converters={"arm": str, "baseline": str}) if (run / ARMS).is_file() else pd.DataFrame()
    frames, manifest = migrate({"requests": read_table(run / REQUESTS), "iterations": read_table(run / ITERATIONS),
                                "summary": read_summary(run / SUMMARY)}, manifest)
    return StudyResults(run, config or {}, manifest, typed_requests(frames["requests"]),
                        typed_iterations(frames["iterations"]), frames["summary"], head, arms)
