"""Stage: engines.  ``make_engine(cfg, mode)`` builds the backend that ``engine.kind`` names.

Backends are imported when asked for, so a study on one backend never imports another's
dependencies (vLLM is imported by ``engines.vllm`` alone, and only once an engine starts)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from prefixstudy.engines.base import Engine, IterationSample, RequestTrace
from prefixstudy.errors import UserError

if TYPE_CHECKING:
    from prefixstudy.config import StudyConfig

# The one registry: kind -> "module:EngineClass:ConfigClass".  A new backend is one file in this
# package and one line here; prefixstudy.config builds its ``engine`` union from this table.
BACKENDS = {
    "vllm": "prefixstudy.engines.vllm:VllmEngine:VllmEngineConfig",
    "echo": "prefixstudy.engines.echo:EchoEngine:EchoEngineConfig",
    "http": "prefixstudy.engines.http:HttpEngine:HttpEngineConfig",
    "vllm-server": "prefixstudy.engines.vllm_server:VllmServerEngine:VllmServerEngineConfig",
    "sim": "prefixstudy.engines.sim:SimEngine:SimEngineConfig",  # run in virtual time by prefixstudy.sim, not the runner
}

__all__ = ["BACKENDS", "Engine", "IterationSample", "RequestTrace", "check_engine_config", "config_classes",
           "engine_class", "make_engine"]


def _entry(kind: str, part: int):
    module, *names = BACKENDS[kind].split(":")
    return getattr(importlib.import_module(module), names[part])


def engine_class(kind: str) -> type[Engine]:
    return _entry(kind, 0)


def config_classes() -> dict[str, type]:
    """kind -> the backend's config class, in registry order (a backend module imports no engine
    library at import time, so this imports no vLLM)."""
    return {kind: _entry(kind, 1) for kind in BACKENDS}


def make_engine(cfg: "StudyConfig", mode: str, *, ray_workers: bool = False, replica_factory=None) -> Engine:
    """An engine for one arm (``mode``: its name; ``on``: prefix caching enabled).  ``ray_workers``: the engine runs
    inside a Ray placement group and should put its own workers there (vLLM on GPUs).  With
    ``cfg.replicas`` > 1, a fleet of replicas behind a router (``engines.fleet``); the replicas
    come from ``replica_factory`` (the Ray executor's actors), else they are built in-process."""
    if cfg.replicas > 1:
        from prefixstudy.engines.fleet import FleetEngine, LocalReplicas

        return FleetEngine(cfg, mode, replica_factory or LocalReplicas(cfg, mode, ray_workers))
    return engine_class(cfg.engine.kind)(cfg.model, cfg.arm_engine(mode), mode, ray_workers=ray_workers)


def check_engine_config(cfg: "StudyConfig", device: str | None = None) -> None:
    """What the backend would refuse at start, refused now (UserError naming the field): each arm's
    engine config, checked as that arm's engine would be built.  ``device``: where the engines run
    (``cpu`` refuses a CPU tier); None: this machine's, when they run here."""
    from prefixstudy.arms import check_offload_device

    check_offload_device(cfg, device)
    cls = engine_class(cfg.engine.kind)
    # Arms without an overlay run the study's engine section: checked together, as the backend
    # checks its modes (every missing target before any unreachable one); each overlay on its own.
    plain = [m for m in cfg.sweep.modes if not (cfg.arm(m).engine or cfg.arm(m).offload)]
    if plain:
        cls.check_config(cfg.model, cfg.engine, plain)
    for mode in (m for m in cfg.sweep.modes if m not in plain):
        try:
            cls.check_config(cfg.model, cfg.arm_engine(mode), [mode])
        except UserError as e:
            raise UserError(f"{e} (arm {mode})") from None
