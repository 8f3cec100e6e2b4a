"""Stage: results, as a run goes.  ``ResultsWriter`` writes each finished point once: its request
and iteration rows as new parts, its summary row into summary.csv, its status into the manifest.
Earlier points are never rewritten, so a killed run keeps every finished point as it was."""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import json
import fcntl
import itertools
import logging
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from prefixstudy.errors import UserError
from prefixstudy.metrics.summary import summarize_point
from prefixstudy.results.provenance import now
from prefixstudy.results.finish import finish_run
from prefixstudy.results.store import (CONFIG, ITERATIONS, LOCK, MANIFEST, REQUESTS, SUMMARY, atomic_write_csv,
                                       atomic_write_text, drop_other_parts, part_name, point_parts_problem,
                                       write_json, write_point_parts)
from prefixstudy.schema import SUMMARY_COLUMNS, PointResult, point_key

if TYPE_CHECKING:
    from prefixstudy.config import StudyConfig

log = logging.getLogger(__name__)

MIN_FREE_BYTES = 200 * 2**20
MODE_ORDER = {"on": 0, "off": 1}


def new_run_dir(cfg: "StudyConfig", out: Path | None = None) -> Path:
    """A new, empty run folder, made by this call.  ``mkdir`` without exist_ok decides: of two runs
    started in one second, one gets the stamp and the other the stamp with -2 (an exists() check
    followed by a later mkdir gave both the same folder)."""
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    base = Path(out or cfg.out) / cfg.study
    try:
        base.mkdir(parents=True, exist_ok=True)
        for i in itertools.count(1):
            run = base / (stamp if i == 1 else f"{stamp}-{i}")
            try:
                run.mkdir()
                return run
            except FileExistsError:
                continue
    except OSError as e:
        raise UserError(f"{base}: results folder is not writable ({e.strerror})") from None
    raise AssertionError("unreachable")


class RunLock:
    """``run.lock`` in a run folder while a run writes it: an exclusive ``flock`` held for the
    run's life, with the owner's pid inside for the message.  The kernel drops the lock when its
    process dies, so a lock file left by a killed run (a dead pid) is simply taken over."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / LOCK
        self.fd: int | None = None

    def acquire(self) -> "RunLock":
        while True:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as e:
                raise UserError(f"{self.path.parent}: results folder is not writable ({e.strerror})") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                owner = os.read(fd, 32).decode(errors="replace").strip() or "?"
                os.close(fd)
                raise UserError(f"{self.path.parent}: a run is still writing this folder (pid {owner}); "
                                "wait for it to end, or stop it, then resume") from None
            # The file may have been removed (its owner ended) between open and flock: lock the one
            # that is there.
            try:
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self.fd = fd
        return self

    def release(self) -> None:
        if self.fd is None:
            return
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        os.close(self.fd)  # closing drops the flock
        self.fd = None


def preflight_out(run_dir: Path) -> None:
    """Refuse an unwritable or full results folder before any engine starts."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / ".write-test"
        probe.write_text("ok")
        probe.unlink()
    except OSError as e:
        raise UserError(f"{run_dir}: results folder is not writable ({e.strerror})") from None
    free = shutil.disk_usage(run_dir).free
    if free < MIN_FREE_BYTES:
        raise UserError(f"{run_dir}: only {free / 2**20:.0f} MiB free, need at least {MIN_FREE_BYTES / 2**20:.0f} MiB")


class ResultsWriter:
    """One run folder, written point by point.  ``manifest`` is the caller's dict: the writer
    records points in it and saves it; what else goes in is the caller's business."""

    def __init__(self, run_dir: Path, cfg: "StudyConfig", manifest: dict):
        self.dir, self.cfg, self.manifest = run_dir, cfg, manifest
        self.points: list[dict] = []  # manifest entries, one per (mode, rate, repeat)
        self.rows: dict[tuple[str, float, int], dict] = {}  # summary rows by (mode, rate, repeat)

    def keep(self, points: list[dict], summary: pd.DataFrame) -> None:
        """Carry over a resumed run's finished points; failed ones are left to run again, as are
        finished ones whose parts are missing or damaged (the manifest alone is not trusted).  A
        kept point missing from summary.csv gets its row again, from its parts."""
        ours = {point_key(p) for p in points}
        self.points = []
        for p in points:
            if p.get("status") != "ok":
                continue
            why = point_parts_problem(self.dir, point_key(p), p.get("n_sent"))
            if why:
                log.warning("warning: %s: cache %s @ %g req/s runs again: %s", self.dir, str(p["mode"]).upper(),
                            float(p["rate"]), why)
                continue
            self.points.append({"repeat": 0, **p})
        keys = {point_key(p) for p in self.points}
        drop_other_parts(self.dir, keys, ours)
        for r in summary.to_dict("records"):
            if point_key(r) in keys:
                self.rows[point_key(r)] = {**r, "repeat": point_key(r)[2]}
        for p in self.points:
            key = point_key(p)
            if key not in self.rows and (self.dir / REQUESTS).is_dir():
                parts = [pd.read_parquet(self.dir / name / part_name(*key)) for name in (REQUESTS, ITERATIONS)]
                self.rows[key] = summarize_point(parts[0], p, self.cfg.checks.hit_rate_tolerance, parts[1])

    def start(self) -> None:
        from prefixstudy.config import dump_config

        atomic_write_text(self.dir / CONFIG, dump_config(self.cfg))
        self._write_summary()
        self.save_manifest()

    def add(self, res: PointResult) -> dict:
        """Write one finished point; returns its summary row."""
        key = res.key
        point = {"mode": res.mode, "rate": res.rate, "repeat": res.repeat,
                 **{k: v for k, v in res.meta.items() if k != "traceback"}}
        limit = self.cfg.engine.admission_limit
        if len(res.requests):  # what the saturation check held the point's requests against
            point.setdefault("admission_limit", limit * self.cfg.replicas if limit else None)
        write_point_parts(self.dir, key, res.requests, res.iterations)
        row = summarize_point(res.requests, point, self.cfg.checks.hit_rate_tolerance, res.iterations)
        point.update(saturated=bool(row["saturated"]), hit_rate_ok=bool(row["hit_rate_ok"]),
                     accounting_ok=row["n_sent"] == row["n_ok"] + row["n_failed"] + row["n_unfinished"])
        self.points = [p for p in self.points if point_key(p) != key] + [point]
        self.rows[key] = row
        self._write_summary()
        self.save_manifest()
        return row

    def mark_failed(self, key: tuple[str, float, int], error: str) -> None:
        """A finished point that a check failed after the fact (the hit-rate policy)."""
        for p in self.points:
            if point_key(p) == key:
                p.update(status="failed", error=error, saturated=False)
        self.rows[key].update(status="failed", error=error)  # its saturation (by the rules) stays in summary.csv
        self._write_summary()
        self.save_manifest()

    def _write_summary(self) -> None:
        rows = sorted(self.rows.values(), key=lambda r: (MODE_ORDER.get(r["mode"], 2), float(r["rate"]), r["repeat"]))
        atomic_write_csv(self.dir / SUMMARY, pd.DataFrame(rows, columns=SUMMARY_COLUMNS))

    def finish(self) -> None:
        """What needs the whole study: the step-cost fit over every point's steps, the engine
        columns of summary.csv it fills, and headline.csv.  Run once at the end of a run (also an
        interrupted one), a merge and a report: refitting after every point cost seconds between
        points of a GPU sweep."""
        finish_run(self.dir, self.manifest)
        self.save_manifest()

    def save_manifest(self, status: str | None = None, in_place_if_full: bool = False) -> None:
        """``in_place_if_full``: on a full disk, where the atomic write finds no room for its temp
        file, overwrite the manifest in place (its blocks are there already), so it says why the
        run stopped."""
        self.manifest["points"] = self.points
        if status:
            self.manifest["status"] = status
            self.manifest["ended_at"] = now()
        try:
            write_json(self.dir / MANIFEST, self.manifest)
        except OSError as e:
            if not in_place_if_full or e.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            with contextlib.suppress(OSError), open(self.dir / MANIFEST, "r+") as f:
                text = json.dumps(self.manifest, indent=2, default=str) + "\n"
                f.write(text)
                f.truncate()
