"""Stage: engines.  The one registry of backends: for each ``engine.kind``, where its engine and
config classes live and what it can do.

The core asks ``capabilities(kind)`` what a backend can do (run replicas, take a CPU tier, ...);
it never tests the kind's name.  A new backend is one file in this package and one entry here;
``prefixstudy.config`` builds its ``engine`` union from this table.  Backend modules are
imported when asked for, so a study on one backend never imports another's dependencies."""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from prefixstudy.engines.base import Engine


@dataclass(frozen=True)
class Capabilities:
    """What one backend can do, as the checks, executors and sweeps ask it."""

    # Runs in virtual time (prefixstudy.sim), never under the runner: `prefixstudy run` hands the
    # study to the simulator, which has no executor, resume or router.
    virtual_time: bool = False
    # Imports vLLM (in process, to launch `vllm serve`, or to replay its scheduler).
    needs_vllm: bool = False
    # Its engines can be started in numbers behind the router (`replicas` > 1): it starts its own
    # engines in process, where a server backend measures the one server it is given.
    replicas: bool = False
    # An arm may overlay engine fields (`arms[].engine`, `arms[].offload`): one engine per arm.
    arm_overlays: bool = True
    # Takes a CPU tier under the prefix cache (`arms[].offload`: vLLM's OffloadingConnector).
    cpu_tier: bool = False
    # The `--capacity` units it takes (prefixstudy.sweep.capacity_axis.UNITS).
    capacity_units: tuple[str, ...] = ()
    # Needs no GPU of a Ray cluster (in process, or a server elsewhere): executor `auto` runs it
    # locally unless a cluster is named, sparing a local cluster's start and processes.
    local_by_default: bool = False
    # Under Ray on GPUs the actor holds the engine's GPUs itself and the engine's own process
    # inherits them (executors.ray_plan.gpu_placement); else its Ray workers take them.
    gpus_in_process: bool = False
    # Its requests take vLLM's per-request `cache_salt` (`sweep.cache_isolation: salt`): each point
    # and repeat then gets its own salt, for servers with no reset endpoint.
    cache_salt: bool = False
    # Its requests share engine steps that an LLM engine's scheduler forms, so a run on it can
    # calibrate the simulator's step cost (`simulate --calibration`).  The echo stand-in answers
    # each request alone, at a fixed cost per token, and a simulated run's step cost is its
    # cost_model.json.
    shared_steps: bool = False
    # Computes on the GPU its process sees, where there is one: each point records that GPU
    # (summary.csv's gpu_name, gpu_uuid; shared.machine.engine_machine).
    gpu: bool = False
    # Measures a server given by its address, on a machine not known here: a point records the
    # client's host and no GPU.
    remote: bool = False


@dataclass(frozen=True)
class Backend:
    module: str
    engine: str  # the engine class's name in ``module``
    config: str  # the config class's name in ``module``
    can: Capabilities


BACKENDS: dict[str, Backend] = {
    "vllm": Backend("prefixstudy.engines.vllm", "VllmEngine", "VllmEngineConfig", Capabilities(
        needs_vllm=True, replicas=True, cpu_tier=True, capacity_units=("blocks", "bytes", "share", "offload_gib"),
        cache_salt=True, shared_steps=True, gpu=True)),
    "echo": Backend("prefixstudy.engines.echo", "EchoEngine", "EchoEngineConfig", Capabilities(
        replicas=True, capacity_units=("blocks", "tier_blocks"), local_by_default=True, cache_salt=True)),
    "http": Backend("prefixstudy.engines.http", "HttpEngine", "HttpEngineConfig", Capabilities(
        local_by_default=True, cache_salt=True, shared_steps=True, remote=True)),
    "vllm-server": Backend("prefixstudy.engines.vllm_server", "VllmServerEngine", "VllmServerEngineConfig",
                           Capabilities(needs_vllm=True, cpu_tier=True, capacity_units=("offload_gib",),
                                        gpus_in_process=True, cache_salt=True, shared_steps=True, gpu=True)),
    # One SGLang server per arm, each needing the GPU it runs on: under Ray the actor holds it.
    "sglang-server": Backend("prefixstudy.engines.sglang_server", "SglangServerEngine", "SglangServerEngineConfig",
                             Capabilities(gpus_in_process=True, shared_steps=True, gpu=True)),
    "sim": Backend("prefixstudy.engines.sim", "SimEngine", "SimEngineConfig", Capabilities(
        virtual_time=True, needs_vllm=True, arm_overlays=False)),
}


def capabilities(kind: str) -> Capabilities:
    return BACKENDS[kind].can


def kinds_that(can: str) -> list[str]:
    """The registered kinds whose capability ``can`` is true, in registry order (for messages
    that name the alternatives)."""
    return [k for k, b in BACKENDS.items() if getattr(b.can, can)]


def engine_class(kind: str) -> type[Engine]:
    b = BACKENDS[kind]
    return getattr(importlib.import_module(b.module), b.engine)


def config_classes() -> dict[str, type]:
    """kind -> the backend's config class, in registry order (a backend module imports no engine
    library at import time, so this imports no vLLM)."""
    return {k: getattr(importlib.import_module(b.module), b.config) for k, b in BACKENDS.items()}
