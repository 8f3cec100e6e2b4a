"""Stage: sim, in parallel.  Points simulated in worker processes, one scheduler per (mode, point).

Each point starts from what a fresh scheduler would give it (``SimSession.restart``): its prefix
cache reset, as on the real engine, and the clock and request ids from the start.  A worker keeps
one session per mode rather than building one per point, because building one allocates every
KV block object.  Workers are forked from a fork server that has already imported
vLLM and resolved a config once (``sim.preload``), so no worker pays the import; the fork server
is a clean process, where the parent may already hold vLLM's threads, so the parent never forks.
A worker's heap stays frozen (``sim.sessions.frozen_heap``: the fork server's, then the rows, then each
session's blocks), so the collector walks only what a point allocates; the worker ends with the run.
``start`` is called once the calibration is fitted, so a refused calibration starts no worker.
"""

from __future__ import annotations

import gc
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from typing import Iterator

from prefixstudy.config import StudyConfig
from prefixstudy.schema import PointResult
from prefixstudy.sim.sessions import RowFacts, SimSession, SimTarget, scheduler_spec

_WORKER: dict = {}


def _init(cfg: StudyConfig) -> None:
    from prefixstudy.workloads import load_rows

    rows = load_rows(cfg)
    _WORKER.update(cfg=cfg, rows=rows, facts=RowFacts.of(rows))
    gc.freeze()  # the rows


def _ready() -> None:
    """A no-op task: submitting one per worker starts the workers now."""


def _point(target: SimTarget, mode: str, rate: float, repeat: int) -> PointResult:
    from prefixstudy.sim.vllm_setup import vllm_config

    w = _WORKER
    if "vc" not in w:  # one resolution per worker; build_scheduler re-pins what differs by mode
        w["vc"] = vllm_config(scheduler_spec(w["cfg"], target, w["cfg"].sweep.modes[0]))
    sessions = w.setdefault("sessions", {})
    if mode not in sessions:  # building one allocates every KV block object (122,224 for the seed)
        sessions[mode] = SimSession(w["cfg"], mode, w["rows"], target, w["vc"], w["facts"])
        gc.freeze()  # its blocks, which live as long as the worker
    session = sessions[mode]
    session.restart()
    return session.run_point(rate, repeat)


def start(cfg: StudyConfig, jobs: int) -> ProcessPoolExecutor:
    """``jobs`` workers, starting now (the fork server imports vLLM in the background)."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["prefixstudy.sim.preload"])
    pool = ProcessPoolExecutor(max_workers=jobs, mp_context=ctx, initializer=_init, initargs=(cfg,))
    for _ in range(jobs):
        pool.submit(_ready)
    return pool


def run_points(pool: ProcessPoolExecutor, cfg: StudyConfig, plan, target: SimTarget) -> Iterator[PointResult]:
    """Every mode x rate of ``cfg``, yielded in the sweep's order (ON first, then by rate); the
    highest rates, the longest points, are started first."""
    points = [(m, r, k) for m in cfg.sweep.modes for r, k in plan.of(m)]
    with pool:
        futures = {p: pool.submit(_point, target, *p) for p in sorted(points, key=lambda p: -p[1])}
        for p in points:
            yield futures[p].result()
