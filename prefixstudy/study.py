"""Orchestration: plan and check → (executor: sessions × points) → results, one point at a time.

``run_study`` is what ``prefixstudy run`` calls; it is usable from a notebook too.  It alone owns
the manifest and the policy on a finished point (the hit-rate check); executors hand points to it
through ``Study.point_done`` and what they know through ``Study.record``.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import signal
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from prefixstudy.config import StudyConfig, flat_config, load_config
from prefixstudy.engines.registry import capabilities, engine_class
from prefixstudy.errors import StudyFailed, UserError, first_line  # noqa: F401 (StudyFailed: importers' name)
from prefixstudy.executors import interleaved, pick_executor
from prefixstudy.results import find_run_dir, read_manifest, read_summary
from prefixstudy.preflight import check_device, check_engine_config, check_installed, check_plan
from prefixstudy.results.provenance import base_manifest, now
from prefixstudy.results.store import CONFIG, ENGINE_LOG, SUMMARY, atomic_write_text
from prefixstudy.results.writer import ResultsWriter, RunLock, new_run_dir, preflight_out
from prefixstudy.metrics.saturation import failed_point
from prefixstudy.runner import Terminated
from prefixstudy.schema import PointResult, point_key
from prefixstudy.workloads import DatasetRow, describe, load_rows

log = logging.getLogger(__name__)

DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


class Study:
    """The sink executors report to: writes each point, applies the hit-rate policy, keeps the manifest."""

    def __init__(self, cfg: StudyConfig, writer: ResultsWriter):
        self.cfg, self.writer = cfg, writer
        self.run_dir = writer.dir

    def point_done(self, res: PointResult) -> dict:
        """Write the point and apply the policies on it: a point whose requests mostly failed is
        failed (a server answering errors is broken, not saturated).  Returns its summary row,
        status and error included."""
        row = self.writer.add(res)
        why = failed_point(res.requests) if row["status"] == "ok" else ""
        if why:
            self.writer.mark_failed(res.key, why)
            return row
        if not row["hit_rate_ok"]:
            msg = (f"cache {res.mode.upper()} @ {res.rate:g} req/s (repeat {res.repeat}): prefix hit rate "
                   f"{row['hit_rate_measured']:.3f}, expected {row['hit_rate_expected']:.3f} (infinite cache), "
                   f"{row['hit_rate_estimated']:.3f} with the engine's blocks")
            if self.cfg.checks.fail_on_hit_rate_mismatch:
                self.writer.mark_failed(res.key, f"hit-rate check: {msg}")
                raise StudyFailed(f"{msg} (checks.fail_on_hit_rate_mismatch is set)")
            log.warning("warning: %s", msg)
        return row

    def record(self, key: str, value: Any) -> None:
        self.writer.manifest[key] = value
        self.writer.save_manifest()

    def append(self, key: str, mode: str, value: Any) -> None:
        self.writer.manifest.setdefault(key, {}).setdefault(mode, []).append(value)
        self.writer.save_manifest()

    def pending_configs(self) -> list[StudyConfig]:
        """Configs restricted to the points (rate, repeat) still to run: one config when every mode
        lacks the same points (modes may then run side by side), else one per mode."""
        cfg = self.cfg
        done = {point_key(p) for p in self.writer.points if p.get("status") == "ok"}
        pending = {m: [(r, k) for r, k in cfg.sweep.points() if (m, float(r), k) not in done] for m in cfg.sweep.modes}
        pending = {m: pts for m, pts in pending.items() if pts}
        if not pending:
            return []
        if len({tuple(pts) for pts in pending.values()}) == 1:
            groups = [(list(pending), next(iter(pending.values())))]
        elif interleaved(cfg):  # keep taking turns: every pending point, skipping the arms that have it
            union = {p for pts in pending.values() for p in pts}
            groups = [(list(pending), [p for p in cfg.sweep.points() if p in union])]
        else:
            groups = [([m], pts) for m, pts in pending.items()]
        out = []
        for modes, pts in groups:
            sub = cfg.model_copy(deep=True)
            sub.sweep.modes, sub.sweep.run_points = modes, pts
            sub.sweep.done_points = {d for d in done if d[0] in modes}
            out.append(sub)
        return out


def config_digest(cfg: StudyConfig) -> str:
    """sha256 of the resolved config, recorded at a run's start: a resume checks config.yaml against it."""
    return hashlib.sha256(json.dumps(cfg.model_dump(mode="json"), sort_keys=True).encode()).hexdigest()


def resume_state(run_dir: Path, cfg_path: Path | None) -> tuple[StudyConfig, list[DatasetRow], Any]:
    """The recorded config, its dataset and what was recorded of a run to resume (its manifest and
    summary; the parts are checked point by point, ``ResultsWriter.keep``)."""
    recorded = load_config(run_dir / CONFIG)
    manifest = read_manifest(run_dir)
    digest = manifest.get("config_sha256")
    if digest is not None and digest != config_digest(recorded):
        raise UserError(f"{run_dir / CONFIG}: changed since the run started (it no longer matches the "
                        "manifest's config_sha256), so its points and new ones would mix two configs; "
                        "refusing to resume: start a new run with the changed config")
    if cfg_path is not None:
        given = load_config(cfg_path)
        a, b = flat_config(recorded.model_dump(mode="json")), flat_config(given.model_dump(mode="json"))
        diff = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
        if diff:
            raise UserError(f"{cfg_path}: differs from the config recorded in {run_dir} at field '{diff[0]}' "
                            f"({b.get(diff[0])!r} vs recorded {a.get(diff[0])!r}); refusing to resume")
    return recorded, load_rows(recorded), SimpleNamespace(manifest=manifest, summary=read_summary(run_dir / SUMMARY))


def run_study(cfg: StudyConfig | None, run_dir: Path | None = None, progress: bool = True,
              resume: Path | None = None, resume_config: Path | None = None) -> Path:
    """Run every mode x rate of ``cfg`` (or, with ``resume``, the missing and failed points of a
    recorded run) and write the results; returns the run folder."""
    old = None
    lock = None
    made = None  # the folder this call made, removed again if it ends before writing anything
    # SIGTERM stops the run as Ctrl-C does from the first input check on, not only once points run.
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _on_sigterm) if main_thread else None
    try:
        if resume is not None:
            run_dir = find_run_dir(resume)
            lock = RunLock(run_dir).acquire()  # refused while the run is still going
            cfg, rows, old = resume_state(run_dir, resume_config)
            if capabilities(cfg.engine.kind).virtual_time:
                raise UserError(f"{run_dir}: a simulated run is not resumed; run it again (it takes seconds to minutes)")
        elif capabilities(cfg.engine.kind).virtual_time:
            return _simulate(cfg, run_dir)
        else:
            rows = load_rows(cfg)
        check_plan(cfg)
        check_installed(cfg)
        check_device(cfg)
        check_engine_config(cfg)  # every input check comes before the results folder is made
        if run_dir is None:
            run_dir = made = new_run_dir(cfg)
        preflight_out(run_dir)
        lock = lock or RunLock(run_dir).acquire()
        executor = pick_executor(cfg)
        if old is None:
            manifest = base_manifest(cfg.study, cfg.engine.kind, engine_class(cfg.engine.kind).versions(),
                                     describe(rows), executor.name)
            manifest["config_sha256"] = config_digest(cfg)
        else:
            manifest = old.manifest
            manifest.pop("error", None)  # why it stopped before; this attempt records its own
            manifest.pop("error_log", None)
            manifest.setdefault("resumed_at", []).append(now())
        writer = ResultsWriter(run_dir, cfg, manifest)
        if old is not None:
            writer.keep(manifest.get("points", []), old.summary)
        writer.start()
        study = Study(cfg, writer)
        return _run(study, executor, rows, progress)
    finally:
        if lock is not None:
            lock.release()
        if made is not None and made.is_dir() and not any(made.iterdir()):
            with contextlib.suppress(OSError):  # never in place of the error that ended the run
                made.rmdir()  # interrupted or refused before the manifest: no empty folder left to read as a run
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _simulate(cfg: StudyConfig, run_dir: Path | None) -> Path:
    """engine.kind sim: the study in virtual time (prefixstudy.engines.sim says why not through the runner)."""
    from prefixstudy.model.gpus import find_gpu
    from prefixstudy.sim.run import simulate

    check_plan(cfg)
    check_installed(cfg)
    check_engine_config(cfg)
    e = cfg.engine
    if e.gpu is not None and find_gpu(e.gpu) is None:
        raise UserError(f"field 'engine.gpu': unknown GPU {e.gpu!r} (see prefixstudy/model/gpus.py)")
    return simulate(cfg, Path(e.calibration), e.gpu, None, None, e.jobs, run_dir)


def _run(study: Study, executor, rows: list[DatasetRow], progress: bool) -> Path:
    """Run the pending points; whatever happens, the manifest ends with the run's status.  A
    signal during the final summary (the step fit) stops it too: the run is then `interrupted`
    (run_study's SIGTERM handler covers it)."""
    status = "failed"
    try:
        try:
            for sub in study.pending_configs():
                executor.run(sub, rows, study, progress=progress)
            ok = all(p.get("status") == "ok" for p in study.writer.points)
            status = "complete" if ok else "complete_with_failures"
        except KeyboardInterrupt:
            status = "interrupted"
            raise
        except OSError as e:
            if e.errno not in DISK_FULL:
                raise
            status = "failed"  # nothing more is written: the summary and fit wait for the resume
            study.writer.manifest["error"] = f"failed: disk full ({first_line(e, limit=300)})"
            raise StudyFailed(f"disk full ({e.strerror}: {e.filename or study.run_dir}); free space first") from None
        except Exception as e:  # the reason stays with the run, not only on a console that may be gone
            log = getattr(e, "log", "")
            if log:  # an engine's own output (a Ray actor's, a server's): kept, and named in the one line
                path = study.run_dir / ENGINE_LOG
                atomic_write_text(path, log)
                study.writer.manifest["error_log"] = ENGINE_LOG
                e.args = (f"{e}; its log: {path}",)
            study.writer.manifest["error"] = first_line(e, limit=1000)
            raise
        finally:
            if status != "interrupted" and "disk full" not in study.writer.manifest.get("error", ""):
                # Ctrl-C means now: `prefixstudy report` finishes the run later
                try:
                    study.writer.finish()
                except KeyboardInterrupt:
                    status = "interrupted"
                    raise
    except (KeyboardInterrupt, Exception) as e:  # the CLI's resume hint names the folder
        e.run_dir = study.run_dir
        raise
    finally:
        study.writer.save_manifest(status=status, in_place_if_full=True)
    return study.run_dir


def _on_sigterm(signum, frame):
    raise Terminated()
