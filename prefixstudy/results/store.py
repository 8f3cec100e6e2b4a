"""Stage: results, on disk.  Fixed paths and atomic writes: every file is written to a temp file
in its folder and renamed over its name, so a reader (or a killed run) never sees half a file.

Layout of one run, ``<out>/<study>/<run-id>/``::

    config.yaml          the fully resolved StudyConfig
    manifest.json        versions, device, times, status of every point
    requests.parquet/    schema.REQUEST_COLUMNS: one part per point, <mode>-<rate>[-r<repeat>].parquet
    iterations.parquet/  schema.ITERATION_COLUMNS: one part per point
    summary.csv          schema.SUMMARY_COLUMNS, one row per mode x rate x repeat
    headline.csv         metrics.headline: one row per rate, over repeats, with intervals
    arms.csv             metrics.headline.versus_baseline: every arm against the baseline arm, per rate
    run.lock             only while a run writes the folder: the writer's pid

The parquet folders are parquet datasets: ``pandas.read_parquet("requests.parquet")`` reads all
parts as one table.  Each point is written once, as its own part, so a long sweep costs no more
per point at its end than at its start.  Runs from before the folders (one file each) still load.
Files follow the umask (0644 by default), like any other tool's output.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pandas as pd

from prefixstudy.errors import UserError
from prefixstudy.metrics import capacity_search as cap
from prefixstudy.shared.files import _temp_beside, atomic_write_bytes, atomic_write_text  # noqa: F401 (the store's names)
from prefixstudy.schema import ITERATION_COLUMNS, REQUEST_COLUMNS

CONFIG = "config.yaml"
MANIFEST = "manifest.json"
REQUESTS = "requests.parquet"
ITERATIONS = "iterations.parquet"
SUMMARY = "summary.csv"
HEADLINE = "headline.csv"
ARMS = "arms.csv"
LOCK = "run.lock"  # while a run writes the folder: its pid, under flock (writer.RunLock)
ENGINE_LOG = "engine-start.log"  # an engine's own output when it did not start (a Ray actor's files, a server's log)


def atomic_write_csv(path: Path, df: pd.DataFrame) -> None:
    atomic_write_text(path, df.to_csv(index=False))


def write_capacity_search(run_dir: Path, manifest: dict, spec, found: dict, baseline: str | None) -> None:
    """A capacity search's answer from each arm's search (``metrics.capacity_search``): capacity.csv,
    and the manifest's ``capacity_search`` (the caller saves the manifest)."""
    manifest["capacity_search"] = cap.manifest_record(spec, found)
    atomic_write_csv(run_dir / cap.CAPACITY_CSV, pd.DataFrame(cap.capacity_rows(found, baseline), columns=cap.COLUMNS))


def write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, default=str) + "\n")


_ARROW = {"str": "string", "bool": "bool_", "int64": "int64", "float64": "float64"}


def _arrow_schema(columns: dict[str, str]):
    import pyarrow as pa

    return pa.schema([(c, getattr(pa, _ARROW[t])()) for c, t in columns.items()])


def atomic_write_parquet(path: Path, df: pd.DataFrame, columns: dict[str, str] | None = None) -> None:
    """One parquet file; with ``columns`` (a schema column map) every part of a dataset gets the
    same arrow schema, even an empty one (whose string columns pandas would call null)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    fd, tmp = _temp_beside(path)
    os.close(fd)
    try:
        schema = _arrow_schema(columns) if columns else None
        pq.write_table(pa.Table.from_pandas(df, schema=schema, preserve_index=False), tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def part_name(mode: str, rate: float, repeat: int = 0) -> str:
    """``on-8.parquet`` for repeat 0 (the name runs before repeats used), ``on-8-r2.parquet`` after."""
    return f"{mode}-{rate:g}{f'-r{repeat}' if repeat else ''}.parquet"


# Read from the right: an arm's name may hold dashes and digits (``on-bs32-8-r1``), a rate never does.
_PARTS = (re.compile(r"^(?P<mode>.+)-(?P<rate>[^-]+)-r(?P<repeat>\d+)$"), re.compile(r"^(?P<mode>.+)-(?P<rate>[^-]+)$"))


def part_key(stem: str) -> tuple[str, float, int] | None:
    """(mode, rate, repeat) of a part's file stem; None for a file that is not a part."""
    for pattern in _PARTS:
        m = pattern.match(stem)
        try:
            if m:
                return (m["mode"], float(m["rate"]), int(m.groupdict().get("repeat") or 0))
        except ValueError:
            continue
    return None


def write_point_parts(run_dir: Path, key: tuple[str, float, int], requests: pd.DataFrame,
                      iterations: pd.DataFrame) -> None:
    """The point's rows as its own parts (replacing an earlier attempt at the same point)."""
    for name, df, cols in ((REQUESTS, requests, REQUEST_COLUMNS), (ITERATIONS, iterations, ITERATION_COLUMNS)):
        folder = run_dir / name
        if folder.is_file():  # a run from before the part folders, being resumed
            split_into_parts(folder, cols)
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write_parquet(folder / part_name(*key), df, cols)


def drop_other_parts(run_dir: Path, keep: set[tuple[str, float, int]], ours: set[tuple[str, float, int]]) -> None:
    """Remove the parts of points in ``ours`` (the points the manifest records: files this tool
    wrote) but not in ``keep`` (a resumed run's failed or damaged points, to run again).  Any other
    file in the folders is the user's and stays."""
    for name, cols in ((REQUESTS, REQUEST_COLUMNS), (ITERATIONS, ITERATION_COLUMNS)):
        folder = run_dir / name
        if folder.is_file():
            split_into_parts(folder, cols)
        for part in folder.glob("*.parquet") if folder.is_dir() else ():
            key = part_key(part.stem)
            if key in ours and key not in keep:
                part.unlink()


def point_parts_problem(run_dir: Path, key: tuple[str, float, int], n_planned: int | None) -> str:
    """Why a finished point's parts cannot be kept ("": they can): missing, unreadable, or with
    fewer measured rows than the point planned (every planned request is a row)."""
    for name in (REQUESTS, ITERATIONS):
        folder = run_dir / name
        if folder.is_file():
            continue  # a run from before the part folders: one table, checked when it is read
        path = folder / part_name(*key)
        if not path.is_file():
            return f"{name}/{path.name} is missing"
        try:
            df = pd.read_parquet(path)
        except Exception as e:  # a truncated or foreign file: pyarrow's errors vary
            return f"{name}/{path.name} is unreadable ({type(e).__name__})"
        if name == REQUESTS and n_planned is not None and "warmup" in df:
            n = int((~df["warmup"].astype(bool)).sum())
            if n != n_planned:
                return f"{name}/{path.name} holds {n} of its {n_planned} measured requests"
    return ""


def split_into_parts(path: Path, columns: dict[str, str]) -> None:
    """Turn a one-file table of an older run into the folder of per-point parts, in place."""
    df = _read_parquet(path)
    old = path.with_name(f".{path.name}.old")
    os.replace(path, old)
    path.mkdir()
    for (mode, rate), part in df.groupby(["mode", "rate"], sort=False):  # runs before repeats: repeat 0
        atomic_write_parquet(path / part_name(mode, rate), part, columns)
    old.unlink()


def _read_parquet(path: Path) -> pd.DataFrame:
    try:
        return pd.read_parquet(path)
    except Exception as e:  # noqa: BLE001 - a truncated or foreign file: pyarrow's errors vary
        why = (str(e).strip().splitlines() or [type(e).__name__])[0]
        # A point's part can be measured again; a whole table in one file cannot.
        hint = ("; `prefixstudy run --resume` on its run measures that point again"
                if path.parent.name in (REQUESTS, ITERATIONS) else "")
        raise UserError(f"{path}: unreadable results table ({why}){hint}") from None


def read_table(path: Path) -> pd.DataFrame:
    """A results table: a folder of parts or an older single file; empty when absent."""
    if path.is_dir():
        parts = sorted(path.glob("*.parquet"), key=_part_key)
        return pd.concat([_read_parquet(p) for p in parts], ignore_index=True) if parts else pd.DataFrame()
    return _read_parquet(path) if path.is_file() else pd.DataFrame()


def _part_key(p: Path) -> tuple:
    """Parts in sweep order: ON before OFF, rates ascending (a name sort would put 16 before 2),
    then repeats."""
    k = part_key(p.stem)
    if k is None:
        return (3, p.stem, 0.0, 0)
    return ({"on": 0, "off": 1}.get(k[0], 2), k[0], k[1], k[2])
