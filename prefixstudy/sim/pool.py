"""Stage: sim, in parallel.  Points simulated in worker processes, one scheduler per (mode, point).

Each worker resolves the VllmConfig once (seconds: vLLM's import and config resolution) and builds
a fresh scheduler per point, which is what a point sees on the real engine too: its prefix cache is
reset before it starts.  Workers are spawned, not forked: the parent may already hold vLLM's threads.
"""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from typing import Iterator

from prefixstudy.config import StudyConfig
from prefixstudy.schema import PointResult
from prefixstudy.sim.study import SimSession, SimTarget, scheduler_spec, sweep_points

_WORKER: dict = {}


def _init(cfg: StudyConfig, target: SimTarget) -> None:
    from prefixstudy.sim.vllm_setup import vllm_config
    from prefixstudy.workloads import load_rows

    _WORKER.update(cfg=cfg, target=target, rows=load_rows(cfg),
                   vc=vllm_config(scheduler_spec(cfg, target, cfg.sweep.modes[0])))


def _point(mode: str, rate: float, repeat: int) -> PointResult:
    w = _WORKER
    return SimSession(w["cfg"], mode, w["rows"], w["target"], w["vc"]).run_point(rate, repeat)


def run_points(cfg: StudyConfig, target: SimTarget, jobs: int) -> Iterator[PointResult]:
    """Every mode x rate of ``cfg``, yielded in the sweep's order (ON first, then by rate); the
    highest rates, the longest points, are started first."""
    points = [(m, r, k) for m in cfg.sweep.modes for r, k in sweep_points(cfg)]
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx, initializer=_init, initargs=(cfg, target)) as pool:
        futures = {p: pool.submit(_point, *p) for p in sorted(points, key=lambda p: -p[1])}
        for p in points:
            yield futures[p].result()
