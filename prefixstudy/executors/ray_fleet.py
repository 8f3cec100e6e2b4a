"""The Ray executor's fleets: one actor per replica, each on its own placement group.

The driver reserves one placement group per replica (``tensor_parallel_size`` bundles of
``{"GPU": 1, "CPU": 1}``, or ``{"CPU": num_cpus_per_engine}`` on the CPU), aimed at the node
``ray_plan.assign_replicas`` chose; the mode's ``EngineActor`` (load generator and router, on the
driver's node) builds the replicas through ``RayReplicas`` and owns them (they die with it).

What the measured times include.  A ``ReplicaActor`` stamps each request when it arrives and times
its tokens and engine stamps on its own clock; the generator places them at its own send time
(``trace.sent_mono``).  So TTFT and E2E run from the replica receiving the request to its tokens:
the router-to-replica hop and the way back are not in them (on one node they are Ray's local
RPC, a few hundred microseconds; across nodes the network).  Routing decisions and dispatch lag are
the generator's.  Engine steps are moved to the generator's clock by the offset measured around the
call that collects them (to within half its round trip; nil on one node, where the monotonic clock
is shared).
"""

from __future__ import annotations

import asyncio
import os
import socket
import time

from prefixstudy.engines.registry import engine_class
from prefixstudy.engines.base import IterationSample, RequestTrace
from prefixstudy.engines.fleet import ReplicaLost
from prefixstudy.errors import StudyFailed, describe_failure
from prefixstudy.executors.own_log import OwnLog
from prefixstudy.executors.ray_plan import summarize_actor_error
from prefixstudy.results.provenance import gpu_name_via_nvml

NAMESPACE = "prefixstudy"


class ReplicaActor:
    """Runs inside a Ray worker: one engine of a fleet."""

    def __init__(self, cfg, mode: str, use_gpu: bool):
        self.own_log = OwnLog()  # before the engine prints: what it logs from here on, should its start fail
        self.engine = engine_class(cfg.engine.kind)(cfg.model, cfg.arm_engine(mode), mode, ray_workers=use_gpu)
        self.use_gpu = use_gpu

    async def start(self) -> dict:
        import ray
        from ray.util import get_current_placement_group

        try:
            await self.engine.start()
        except Exception as e:  # noqa: BLE001 - the cause, and this actor's log, travel to the generator (then the driver)
            log = self.own_log.since()
            raise StudyFailed(describe_failure(e, log), log=log) from None
        pg = get_current_placement_group()
        table = ray.util.placement_group_table(pg) if pg is not None else {}
        e = self.engine
        return {"pid": os.getpid(), "host": socket.gethostname(), "node_id": ray.get_runtime_context().get_node_id(),
                "pg_node_id": (table.get("bundles_to_node_id") or {}).get(0), "device": gpu_name_via_nvml(self.use_gpu),
                "startup_s": e.startup_s, "block_size": e.block_size, "num_blocks": e.num_blocks,
                "step_timing": e.step_timing, "async_scheduling": e.async_scheduling}

    async def reset_prefix_cache(self) -> None:
        await self.engine.reset_prefix_cache()

    async def begin(self) -> None:
        self.engine.begin_iterations()

    async def end(self) -> tuple[list[IterationSample], float]:
        return self.engine.end_iterations(), time.monotonic()

    async def generate(self, prompt: list[int], output_len: int, request_id: str) -> RequestTrace:
        tr = RequestTrace(time.monotonic())  # arrival here: the hop from the router is not measured
        try:
            await self.engine.generate(prompt, output_len, request_id, tr)
        except Exception as e:  # noqa: BLE001 - the request failed, the actor lives: a row with the cause
            tr.error = f"{type(e).__name__}: {e}".strip()[:500]
        return tr

    def is_dead(self) -> bool:
        return self.engine.is_dead()

    async def stop(self) -> None:
        self.engine.shutdown()


class RemoteReplica:
    """A fleet's handle on one ReplicaActor, used inside the generator's event loop."""

    def __init__(self, handle, name: str):
        self.handle, self.name = handle, name
        self.info: dict = {}
        self.dead = False

    async def _call(self, method: str, *args):
        from ray.exceptions import RayActorError

        try:
            return await getattr(self.handle, method).remote(*args)
        except RayActorError as e:
            self.dead = True
            raise ReplicaLost(summarize_actor_error(e)) from None

    async def start(self) -> None:
        from ray.exceptions import RayTaskError

        try:
            info = await self._call("start")
        except RayTaskError as e:  # ReplicaActor.start's StudyFailed, without Ray's wrapping
            cause = getattr(e, "cause", None)
            if isinstance(cause, StudyFailed):  # unpickled with its log (StudyFailed.__reduce__)
                raise cause from None
            raise
        self.info = {**info, "actor": self.name}
        self.block_size, self.num_blocks = self.info["block_size"], self.info["num_blocks"]
        self.step_timing, self.async_scheduling = self.info["step_timing"], self.info["async_scheduling"]

    async def reset_prefix_cache(self) -> None:
        await self._call("reset_prefix_cache")

    async def begin(self) -> None:
        await self._call("begin")

    async def end(self) -> list[IterationSample]:
        t0 = time.monotonic()
        samples, remote_now = await self._call("end")
        offset = (t0 + time.monotonic()) / 2 - remote_now
        for s in samples:
            s.start_mono += offset
            s.end_mono += offset
        return samples

    async def generate(self, prompt, output_len, request_id, trace: RequestTrace) -> RequestTrace:
        import ray
        from ray.exceptions import RayActorError

        ref = self.handle.generate.remote(prompt, output_len, request_id)
        try:
            rt = await ref
        except asyncio.CancelledError:  # the point's deadline or request_timeout_s: stop it there too
            ray.cancel(ref)
            raise
        except RayActorError as e:
            self.dead = True
            raise ReplicaLost(summarize_actor_error(e)) from None
        shift = trace.sent_mono - rt.sent_mono  # the replica's arrival stamp -> our send time
        trace.token_times = [t + shift for t in rt.token_times]
        for f in ("queued_ts", "scheduled_ts", "first_token_ts", "last_token_ts"):
            setattr(trace, f, getattr(rt, f) + shift)
        trace.num_cached_tokens, trace.output_token_ids, trace.error = rt.num_cached_tokens, rt.output_token_ids, rt.error
        trace.cached_tokens_reported = rt.cached_tokens_reported
        if rt.error and not self.dead:
            try:  # an engine that died inside a living actor loses the replica, not just the request
                self.dead = await self.handle.is_dead.remote()
            except RayActorError:
                self.dead = True
            if self.dead:
                raise ReplicaLost(f"engine died: {rt.error}"[:500])
        return trace

    def is_dead(self) -> bool:
        return self.dead

    def shutdown(self) -> None:
        import ray

        try:
            ray.kill(self.handle, no_restart=True)
        except Exception:  # noqa: BLE001 - best-effort cleanup: already gone
            pass


def replica_env(env: dict[str, str], replica: int, use_gpu: bool) -> dict[str, str]:
    """A replica's env: on GPUs its own torch.compile cache.  The modes already compile apart (an
    H200 engine that loaded another engine's artifacts died with "CUDA driver error: invalid
    argument"); the replicas of one mode start one after the other, so without this the second
    would load the first's.  CPU engines share one cache, as single engines do."""
    if not use_gpu or "VLLM_CACHE_ROOT" not in env:
        return env
    return {**env, "VLLM_CACHE_ROOT": f"{env['VLLM_CACHE_ROOT']}-replica{replica}"}


class RayReplicas:
    """Builds a fleet's replicas as Ray actors on the placement groups the driver reserved
    (picklable: it travels to the generator actor).  ``names[i]`` is replica i's actor name."""

    def __init__(self, cfg, mode: str, use_gpu: bool, pgs: list, names: list[str], env: dict[str, str]):
        self.cfg, self.mode, self.use_gpu, self.pgs, self.names, self.env = cfg, mode, use_gpu, pgs, names, env

    def make(self, replica: int, generation: int) -> RemoteReplica:
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        name = self.names[replica] + (f"/restart{generation}" if generation else "")
        strategy = PlacementGroupSchedulingStrategy(placement_group=self.pgs[replica],
                                                    placement_group_capture_child_tasks=True)
        # GPU: the actor holds no GPU itself, vLLM's Ray workers take the bundles' GPUs (as for one engine).
        cpus = 1 if self.use_gpu else self.cfg.ray.num_cpus_per_engine
        handle = ray.remote(ReplicaActor).options(
            name=name, namespace=NAMESPACE, runtime_env={"env_vars": replica_env(self.env, replica, self.use_gpu)},
            max_restarts=0, num_cpus=cpus,
            num_gpus=0, scheduling_strategy=strategy).remote(self.cfg, self.mode, self.use_gpu)
        return RemoteReplica(handle, name)
