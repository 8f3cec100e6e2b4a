"""Stage: engines.  ``make_engine(cfg, mode)``: the engine one arm of a study runs, of the backend
that ``engine.kind`` names, or a fleet of them behind a router (``replicas`` > 1)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from prefixstudy.engines.base import Engine
from prefixstudy.engines.registry import engine_class

if TYPE_CHECKING:
    from prefixstudy.config import StudyConfig


def make_engine(cfg: "StudyConfig", mode: str, *, ray_workers: bool = False, replica_factory=None) -> Engine:
    """An engine for one arm (``mode``: its name; ``on``: prefix caching enabled).  ``ray_workers``: the engine runs
    inside a Ray placement group and should put its own workers there (vLLM on GPUs).  With
    ``cfg.replicas`` > 1, a fleet of replicas behind a router (``engines.fleet``); the replicas
    come from ``replica_factory`` (the Ray executor's actors), else they are built in-process."""
    if cfg.replicas > 1:
        from prefixstudy.engines.fleet import FleetEngine, LocalReplicas

        return FleetEngine(cfg, mode, replica_factory or LocalReplicas(cfg, mode, ray_workers))
    return engine_class(cfg.engine.kind)(cfg.model, cfg.arm_engine(mode), mode, ray_workers=ray_workers)
