"""The Ray executor's engine actor: one ``ModeSession`` (the engine and the code that sends the
requests) inside a Ray worker, so measured latency never crosses the network, and the
environment it is started with (``actor_env``)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from prefixstudy.config import StudyConfig
from prefixstudy.engines.registry import capabilities, engine_class
from prefixstudy.executors.own_log import OwnLog
from prefixstudy.results.provenance import gpu_name_via_nvml
from prefixstudy.runner import ModeSession
from prefixstudy.schema import PointResult

PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # the folder holding prefixstudy/


def actor_env(cfg: StudyConfig, mode: str, use_gpu: bool) -> dict[str, str]:
    """Env vars an engine actor gets (runtime_env): what its backend asks for, and PYTHONPATH with
    this package's source folder first."""
    env = engine_class(cfg.engine.kind).process_env(cfg.arm_engine(mode), mode, use_gpu)
    paths = [str(PACKAGE_ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    return env


def _gpus_in_process(cfg: StudyConfig) -> bool:
    """Whether the engine's own process must see its GPUs, not only its Ray workers."""
    return capabilities(cfg.engine.kind).gpus_in_process


class EngineActor:
    """Runs inside a Ray worker: one ModeSession (engine + load generator), points on request."""

    def __init__(self, cfg: StudyConfig, mode: str, rows, use_gpu: bool, replica_factory=None):
        # replica_factory (cfg.replicas > 1): this actor is the fleet's load generator and router,
        # and builds its replicas as actors of their own (executors.ray_fleet).
        own_log = OwnLog()  # before the engine prints: what it logs from here on, should its start fail
        self.session = ModeSession(cfg, mode, rows, ray_workers=use_gpu, replica_factory=replica_factory,
                                   own_log=own_log)
        self.mode, self.use_gpu = mode, use_gpu

    async def start(self) -> dict:
        await self.session.__aenter__()
        import ray

        return {"pid": os.getpid(), "host": socket.gethostname(),
                "node_ip": ray.util.get_node_ip_address(), "device": gpu_name_via_nvml(self.use_gpu),
                **engine_class(self.session.cfg.engine.kind).versions(),
                "startup_s": self.session.engine.startup_s, "block_size": self.session.engine.block_size,
                "warmup": self.session.warmup,
                **({"replicas": self.session.engine.started} if self.session.cfg.replicas > 1 else {})}

    async def run_point(self, rate: float, repeat: int = 0) -> PointResult:
        return await self.session.run_point(rate, repeat)

    async def recover(self) -> bool:
        """After a failed point: restart the engine if it died inside this (living) actor."""
        if self.session.engine.is_dead():
            await self.session.restart()
            return True
        return False

    async def stop(self) -> None:
        await self.session.__aexit__(None, None, None)
