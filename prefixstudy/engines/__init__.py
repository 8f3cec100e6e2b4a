"""Stage: engines.  ``make_engine(cfg, mode)`` builds the backend that ``engine.kind`` names.

Backends are imported when asked for, so a study on one backend never imports another's
dependencies (vLLM is imported by ``engines.vllm`` alone, and only once an engine starts)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from prefixstudy.engines.base import Engine, IterationSample, RequestTrace

if TYPE_CHECKING:
    from prefixstudy.config import StudyConfig

# kind -> "module:class".  A new backend is one file here plus one line in this table and one
# config class in prefixstudy.config's union.
BACKENDS = {
    "vllm": "prefixstudy.engines.vllm:VllmEngine",
    "echo": "prefixstudy.engines.echo:EchoEngine",
    "http": "prefixstudy.engines.http:HttpEngine",
    "vllm-server": "prefixstudy.engines.vllm_server:VllmServerEngine",
    "sim": "prefixstudy.engines.sim:SimEngine",  # run in virtual time by prefixstudy.sim, not the runner
}

__all__ = ["BACKENDS", "Engine", "IterationSample", "RequestTrace", "check_engine_config", "engine_class", "make_engine"]


def engine_class(kind: str) -> type[Engine]:
    module, _, name = BACKENDS[kind].partition(":")
    return getattr(importlib.import_module(module), name)


def make_engine(cfg: "StudyConfig", mode: str, *, ray_workers: bool = False, replica_factory=None) -> Engine:
    """An engine for one mode (``on``: prefix caching enabled).  ``ray_workers``: the engine runs
    inside a Ray placement group and should put its own workers there (vLLM on GPUs).  With
    ``cfg.replicas`` > 1, a fleet of replicas behind a router (``engines.fleet``); the replicas
    come from ``replica_factory`` (the Ray executor's actors), else they are built in-process."""
    if cfg.replicas > 1:
        from prefixstudy.engines.fleet import FleetEngine, LocalReplicas

        return FleetEngine(cfg, mode, replica_factory or LocalReplicas(cfg, mode, ray_workers))
    return engine_class(cfg.engine.kind)(cfg.model, cfg.engine, mode, ray_workers=ray_workers)


def check_engine_config(cfg: "StudyConfig") -> None:
    """What the backend would refuse at start, refused now (UserError naming the field)."""
    engine_class(cfg.engine.kind).check_config(cfg.model, cfg.engine, cfg.sweep.modes)
