"""Orchestration: plan and check → (executor: sessions × points) → results, one point at a time.

``run_study`` is what ``prefixstudy run`` calls; it is usable from a notebook too.  It alone owns
the manifest and the policy on a finished point (the hit-rate check); executors hand points to it
through ``Study.point_done`` and what they know through ``Study.record``.
"""

from __future__ import annotations

import contextlib
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
from prefixstudy.executors import pick_executor
from prefixstudy.results import find_run_dir, read_manifest, read_summary
from prefixstudy.results.migrate import migrate
from prefixstudy.study.preflight import check_engine_config, check_inputs, check_installed, check_plan, check_simulated
from prefixstudy.results.provenance import base_manifest, machine, now
from prefixstudy.results.store import CONFIG, SUMMARY
from prefixstudy.results.writer import ResultsWriter, RunLock, new_run_dir, preflight_out
from prefixstudy.study.points import Study, run_pending  # noqa: F401 (Study: importers' name)
from prefixstudy.runner import Terminated
from prefixstudy.workloads import DatasetRow, describe, load_rows

log = logging.getLogger(__name__)


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
    frames, manifest = migrate({"summary": read_summary(run_dir / SUMMARY)}, manifest)
    return recorded, load_rows(recorded), SimpleNamespace(manifest=manifest, summary=frames["summary"])


def run_study(cfg: StudyConfig | None, run_dir: Path | str | None = None, progress: bool = True,
              resume: Path | str | None = None, resume_config: Path | str | None = None) -> Path:
    """Run every mode x rate of ``cfg`` (or, with ``resume``, the missing and failed points of a
    recorded run) and write the results; returns the run folder."""
    run_dir, resume, resume_config = (None if p is None else Path(p) for p in (run_dir, resume, resume_config))
    old = None
    lock = None
    made = None  # the folder this call made, removed again if it ends before writing anything
    # SIGTERM stops the run as Ctrl-C does from the first input check on, not only once points run.
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _on_sigterm) if main_thread else None
    try:
        if cfg is not None and cfg.grid:
            raise UserError("field 'grid': a grid runs one cell at a time through prefixstudy.sweep.run_sweep.run_sweep "
                            "(as `prefixstudy run` does); run_study runs one cell")
        if resume is not None:
            run_dir = find_run_dir(resume)
            lock = RunLock(run_dir).acquire()  # refused while the run is still going
            cfg, rows, old = resume_state(run_dir, resume_config)
        elif capabilities(cfg.engine.kind).virtual_time:
            return _simulate(cfg, run_dir)
        else:
            rows = load_rows(cfg)
        # A simulated run (its manifest's `sim`, whatever engine its config names) resumes in virtual
        # time with the engine and step costs it recorded, never on a real engine.
        simulated = old is not None and old.manifest.get("sim") is not None
        if simulated:  # what its first start checked, less the device and the engine's own arguments
            check_plan(cfg)
            check_simulated(cfg)
        else:
            check_inputs(cfg)  # every input check comes before the results folder is made
        if run_dir is None:
            run_dir = made = new_run_dir(cfg)
        preflight_out(run_dir)
        lock = lock or RunLock(run_dir).acquire()
        executor = _resumed_simulation(run_dir, old.manifest) if simulated else pick_executor(cfg)
        if old is None:
            manifest = base_manifest(cfg.study, cfg.engine.kind, engine_class(cfg.engine.kind).versions(),
                                     describe(rows), executor.name)
            manifest["config_sha256"] = config_digest(cfg)
        else:
            manifest = old.manifest
            manifest.pop("error", None)  # why it stopped before; this attempt records its own
            manifest.pop("error_log", None)
            manifest.setdefault("resumed_at", []).append(now())
            manifest.setdefault("machines", []).append(machine())
        writer = ResultsWriter(run_dir, cfg, manifest)
        if old is not None:
            writer.keep(manifest.get("points", []), old.summary)
        writer.start()
        study = Study(cfg, writer)
        return run_pending(study, executor, rows, progress)
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
    from prefixstudy.costmodel.gpus import find_gpu
    from prefixstudy.study.simulate import simulate

    check_plan(cfg)
    check_installed(cfg)
    check_engine_config(cfg)
    e = cfg.engine
    if e.gpu is not None and find_gpu(e.gpu) is None:
        raise UserError(f"field 'engine.gpu': unknown GPU {e.gpu!r} (see prefixstudy/costmodel/gpus.py)")
    return simulate(cfg, Path(e.calibration), e.gpu, None, None, e.jobs, run_dir, stepwise=e.stepwise)


def _resumed_simulation(run_dir: Path, manifest: dict):
    from prefixstudy.study.simulate import resumed_executor

    return resumed_executor(run_dir, manifest)


def _on_sigterm(signum, frame):
    raise Terminated()
