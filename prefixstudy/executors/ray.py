"""Executor ``ray``: one actor per mode on a Ray cluster, its load generator beside it.

Each mode's ``ModeSession`` (the engine and the code that sends the requests) runs inside one
``EngineActor`` (``ray_actor``), so measured latency never crosses the network.  The driver plans
resources (GPU placement groups, or CPUs; ``ray_plan``), decides whether the arms run side by side,
take turns point by point on actors kept up together, or run one after the other, asks the actors
for points, and hands every ``PointResult`` that comes back to the study's sink: results travel
through Ray, no shared filesystem is needed.  An actor that dies (OOM, crash, killed) turns its
point into a failed row with the cause, a fresh actor takes its place and the sweep goes on.

Ray is imported here and in the other ``ray_*`` modules (lazily), and nowhere else.
"""

from __future__ import annotations

import asyncio
import logging
import time

from tqdm import tqdm

from prefixstudy.config import StudyConfig
from prefixstudy.errors import StudyFailed, UserError, first_line
from prefixstudy.executors.base import StudySink, interleaved, point_line, repeat_tag
from prefixstudy.executors.ray_actor import EngineActor, _gpus_in_process, actor_env
from prefixstudy.executors.ray_cluster import NAMESPACE, alive_node_ids, alive_nodes, connect, ray_failure
from prefixstudy.executors.ray_plan import (actor_name, assign_replicas, gpu_placement, node_slots, one_after_the_other,
                                            plan_parallel, summarize_actor_error)
from prefixstudy.runner import run_until_signal
from prefixstudy.runner.warmup import note as warmup_note
from prefixstudy.schema import PointResult
from prefixstudy.executors.run_plan import RunPlan

log = logging.getLogger(__name__)

PLACEMENT_TIMEOUT_S = 600.0
STOP_TIMEOUT_S = 60.0


class _ModeRunner:
    """The driver's side of one mode: its placement group, its actor, its points in order."""

    def __init__(self, ex: "RayExecutor", mode: str):
        self.ex, self.mode = ex, mode
        self.actor = None
        self.pg = None
        self.fleet_pgs: list = []  # cfg.replicas > 1: one placement group per replica
        self.generation = 0
        self.finished_requests = 0  # of points already handed to the sink: the progress bar
        self.dead = False  # its actor died at the last point: the next point starts a fresh one

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
        opts = dict(name=actor_name(ex.cfg.study, ex.sink.run_dir, self.mode, self.generation), namespace=NAMESPACE,
                    runtime_env={"env_vars": actor_env(ex.cfg, self.mode, ex.use_gpu)}, max_restarts=0)
        if ex.cfg.replicas > 1:
            pass  # the generator's resources and place: _fleet_placement
        elif ex.use_gpu:
            tp = ex.cfg.engine.tensor_parallel_size
            bundles, actor_res = gpu_placement(tp, _gpus_in_process(ex.cfg))
            if self.pg is None:
                from ray.util.placement_group import placement_group

                self.pg = placement_group(bundles, strategy="STRICT_PACK")
                ex.pgs.append(self.pg)  # removed by the executor, even after Ctrl-C
                try:
                    await asyncio.wait_for(self.pg.ready(), PLACEMENT_TIMEOUT_S)
                except asyncio.TimeoutError:
                    raise UserError(f"cache {self.mode.upper()}: no node freed {tp} GPUs within "
                                    f"{PLACEMENT_TIMEOUT_S:g} s") from None
            # In-process vLLM: the actor holds no GPU, its Ray workers take the bundles' GPUs;
            # vllm-server: the actor holds them all, for the server it launches (ray_plan.gpu_placement).
            res = dict(actor_res)
            bundle = res.pop("bundle", None)
            opts.update(**res, scheduling_strategy=PlacementGroupSchedulingStrategy(
                placement_group=self.pg, placement_group_capture_child_tasks=True,
                **({} if bundle is None else {"placement_group_bundle_index": bundle})))
        else:
            opts.update(num_cpus=ex.cfg.ray.num_cpus_per_engine, num_gpus=0)
        factory = None
        if ex.cfg.replicas > 1:
            factory = await self._fleet_placement(opts)
        cls = ray.remote(EngineActor)
        self.actor = cls.options(**opts).remote(ex.cfg, self.mode, ex.rows_ref, ex.use_gpu, factory)
        ex.actors.append(self.actor)
        info = await self._started(self.actor.start.remote())
        info["actor"] = actor_name(ex.cfg.study, ex.sink.run_dir, self.mode, self.generation)
        ex.engine_started(self.mode, info)

    async def _started(self, call) -> dict:
        """The actor's start, or one line for the user: the engine's own reason (ModeSession's
        StudyFailed) without Ray's wrapping of the remote traceback."""
        from ray.exceptions import RayActorError, RayTaskError

        try:
            return await call
        except RayTaskError as e:
            cause = getattr(e, "cause", None)
            if isinstance(cause, StudyFailed):  # unpickled with its log (StudyFailed.__reduce__)
                raise cause from None
            raise StudyFailed(f"cache {self.mode.upper()}: the engine actor did not start "
                              f"({type(cause or e).__name__}: {first_line(cause or e)})") from None
        except RayActorError as e:
            raise StudyFailed(f"cache {self.mode.upper()}: the engine actor died while starting "
                              f"({summarize_actor_error(e)})") from None

    async def _fleet_placement(self, opts: dict):
        """A fleet: one placement group per replica, aimed at the node the plan chose for it; the
        generator (load generator + router) on the driver's node, beside it (soft: anywhere if full)."""
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from prefixstudy.executors.ray_fleet import RayReplicas

        ex, cfg = self.ex, self.ex.cfg
        if not self.fleet_pgs:
            tp = cfg.engine.tensor_parallel_size
            bundles = [{"GPU": 1, "CPU": 1}] * tp if ex.use_gpu else [{"CPU": cfg.ray.num_cpus_per_engine}]
            for node in ex.replica_nodes[self.mode]:
                pg = placement_group(bundles, strategy="STRICT_PACK", _soft_target_node_id=node)
                ex.pgs.append(pg)
                self.fleet_pgs.append(pg)
            try:
                await asyncio.wait_for(asyncio.gather(*(pg.ready() for pg in self.fleet_pgs)), PLACEMENT_TIMEOUT_S)
            except asyncio.TimeoutError:
                raise UserError(f"cache {self.mode.upper()}: no room for {cfg.replicas} replicas within "
                                f"{PLACEMENT_TIMEOUT_S:g} s") from None
        import ray

        opts.update(num_cpus=0 if ex.use_gpu else 1, num_gpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(
            ray.get_runtime_context().get_node_id(), soft=True))
        base = opts["name"]
        return RayReplicas(cfg, self.mode, ex.use_gpu, self.fleet_pgs, [f"{base}/replica{i}" for i in range(cfg.replicas)],
                           actor_env(cfg, self.mode, ex.use_gpu))

    async def _replace_actor(self) -> None:
        import ray

        if self.actor is not None:
            ray.kill(self.actor, no_restart=True)
        self.generation += 1
        self.ex.bar.set_description(f"restarting engine (cache {self.mode.upper()})")
        await self._start_actor()

    async def start(self) -> None:
        self.ex.bar.set_description(f"starting engine (cache {self.mode.upper()})")
        await self._start_actor()

    async def run_all(self) -> None:
        ex = self.ex
        await self.start()
        # Side by side, no point is measured while the other engine still compiles and warms up.
        ex.engines_up += 1
        if ex.engines_up == len(ex.runners) or not ex.parallel:
            ex.all_up.set()
        await ex.all_up.wait()
        await self.run_points()

    async def run_points(self) -> None:
        """The executor's current plan's points, in order, on this mode's actor."""
        for rate, repeat in self.ex.plan.of(self.mode):
            await self.run_point(rate, repeat)

    async def run_point(self, rate: float, repeat: int) -> None:
        """One point on this mode's actor, handed to the sink; an actor that died is replaced first."""
        from ray.exceptions import RayActorError, RayError

        ex = self.ex
        if self.dead:  # only now, so a failure at the last point costs no engine start
            await self._replace_actor()
            self.dead = False
        ex.bar.set_description(f"cache {self.mode.upper()} @ {rate:g} req/s" + repeat_tag(ex.cfg, repeat))
        asked_at = time.time()
        try:
            res = await self.actor.run_point.remote(rate, repeat)
        except RayActorError as e:
            res = PointResult.failed(self.mode, rate, summarize_actor_error(e), repeat, started_at=asked_at)
            self.dead = True
        except RayError as e:  # the call failed, the actor may live: recover() below will tell
            res = PointResult.failed(self.mode, rate, f"{type(e).__name__}: {' '.join(str(e).split())}"[:500],
                                     repeat, started_at=asked_at)
        self.finished_requests += ex.cfg.sweep.requests_for(rate, repeat)
        ex.point_done(res)
        if res.meta.get("status") == "failed" and not self.dead:
            try:
                await self.actor.recover.remote()  # restarts an engine that died inside a living actor
            except RayActorError:
                self.dead = True

    async def stop(self) -> None:
        import ray

        if self.actor is not None:
            try:
                await asyncio.wait_for(self.actor.stop.remote(), STOP_TIMEOUT_S)
            except Exception:  # a dead or stuck actor is killed below all the same
                log.debug("engine actor %s did not stop cleanly", self.mode, exc_info=True)
            ray.kill(self.actor, no_restart=True)
            self.actor = None
        for pg in self.fleet_pgs:  # the fleet's replicas died with their generator (it owned them)
            try:
                ray.util.remove_placement_group(pg)
                self.ex.pgs.remove(pg)
            except Exception:
                log.debug("placement group of a %s replica not removed", self.mode, exc_info=True)
        self.fleet_pgs = []
        if self.pg is not None:
            # Modes one after the other: the next mode's placement group needs these GPUs.
            pg, self.pg = self.pg, None
            try:
                ray.util.remove_placement_group(pg)
                self.ex.pgs.remove(pg)
            except Exception:  # a cluster going down; the executor's final cleanup tries again
                log.debug("placement group of %s not removed", self.mode, exc_info=True)


class RayExecutor:
    """Runs every mode in its own Ray actor: side by side when the cluster has room; else, where it
    places every arm's actor at once, the arms take turns point by point; else one after the other."""

    name = "ray"

    def run(self, cfg: StudyConfig, plan: RunPlan, rows, sink: StudySink, progress: bool = True) -> None:
        import ray

        self.cfg, self.plan, self.sink = cfg, plan, sink
        self.actors: list = []
        self.pgs: list = []
        from ray.exceptions import RayError

        owned = connect(cfg.ray.address, cfg.ray.num_cpus)
        try:
            run_until_signal(self._run(rows, progress))
        except RayError as e:  # not a task's or an actor's (those are rows or StudyFailed): Ray's own
            raise StudyFailed(ray_failure(e)) from None
        finally:
            # Also on Ctrl-C / SIGTERM, when the event loop is gone: nothing of ours stays on the cluster.
            for a in self.actors:
                try:
                    ray.kill(a, no_restart=True)
                except Exception:  # noqa: BLE001 - best-effort cleanup
                    pass
            for pg in self.pgs:
                try:
                    ray.util.remove_placement_group(pg)
                except Exception:  # noqa: BLE001 - best-effort cleanup
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
        tp = cfg.engine.tensor_parallel_size
        plan = plan_parallel(cfg.ray.parallel, len(cfg.sweep.modes), nodes, self.use_gpu, tp,
                             cfg.ray.num_cpus_per_engine, cfg.replicas, interleave=interleaved(cfg))
        self.parallel, self.turns = plan["used"], plan["turns"]
        if note := one_after_the_other(plan):
            log.warning("%s", note)
        if cfg.replicas > 1:  # which node each replica of each mode is aimed at
            ids = alive_node_ids()
            slots = [node_slots(n, self.use_gpu, tp, cfg.ray.num_cpus_per_engine) for n in nodes]
            modes = cfg.sweep.modes
            if self.parallel:
                both, r = assign_replicas(slots, cfg.replicas * len(modes)), cfg.replicas
                per_mode = {m: both[k * r:(k + 1) * r] for k, m in enumerate(modes)}  # each fleet spread
            else:
                per_mode = {m: assign_replicas(slots, cfg.replicas) for m in modes}
            self.replica_nodes = {m: [ids[k] for k in ks] for m, ks in per_mode.items()}
            plan["replica_nodes"] = self.replica_nodes
        self.sink.record("parallel", plan)
        gpus_in_process = _gpus_in_process(cfg)
        bundles, actor_res = gpu_placement(tp, gpus_in_process)
        self.sink.record("ray", {
            "address": cfg.ray.address,
            "gcs_address": ray.get_runtime_context().gcs_address,
            "ray_version": ray.__version__,
            "nodes": len(nodes),
            "cluster_cpus": sum(n.get("CPU", 0) for n in nodes),
            "cluster_gpus": gpus,
            "engine_resources": ({"placement_group": bundles, "strategy": "STRICT_PACK", "actor": actor_res}
                                 if self.use_gpu else {"CPU": cfg.ray.num_cpus_per_engine}),
            "replicas": cfg.replicas,
            "engine_workers_in_placement_group": self.use_gpu and not gpus_in_process,
        })

    def engine_started(self, mode: str, info: dict) -> None:
        self.sink.append("engines", mode, info)
        if note := warmup_note(mode, info["warmup"]):
            with tqdm.external_write_mode():  # its own line, not the progress bar's
                log.warning("%s", note)
        # The driver may sit on a CPU-only head node: the engines' device is the one that counts.
        self.sink.record("device", info["device"])

    def point_done(self, res: PointResult) -> None:
        summary = self.sink.point_done(res)
        failed = summary["status"] == "failed"
        self.bar.write(point_line(res.mode, res.rate, summary, summary["error"] if failed else "",
                                  repeat_tag(self.cfg, res.repeat)))
        self._refresh_bar()

    def _refresh_bar(self) -> None:
        self.bar.n = sum(r.finished_requests for r in self.runners)
        self.bar.refresh()

    async def _run(self, rows, progress: bool) -> None:
        import ray

        self._plan()
        self.rows_ref = ray.put(rows)
        self.start_lock, self.all_up, self.engines_up = asyncio.Lock(), asyncio.Event(), 0
        self.runners = [_ModeRunner(self, m) for m in self.cfg.sweep.modes]
        self.bar = tqdm(total=self.plan.requests(self.cfg), unit="req", disable=not progress, dynamic_ncols=True)
        t0 = time.monotonic()
        try:
            if self.parallel:
                await asyncio.gather(*(r.run_all() for r in self.runners))
                await self._later_rounds()
            elif self.turns:
                for r in self.runners:  # every engine up (and warm) before the first point is measured
                    await r.start()
                await self._take_turns()
                await self._later_rounds()
            else:
                for r in self.runners:
                    try:
                        await r.run_all()
                        if r is self.runners[-1]:  # a search's next rounds that need this arm alone
                            await self._later_rounds([r])
                    finally:
                        await r.stop()  # free its resources before the next mode's engine starts
        finally:
            await asyncio.gather(*(r.stop() for r in self.runners), return_exceptions=True)
            self.bar.close()
            log.info("ray executor: %d mode(s) in %.1f s", len(self.runners), time.monotonic() - t0)

    async def _take_turns(self) -> None:
        """The plan's points one at a time, the arms taking turns (``RunPlan.turns``: A B, B A, ...)."""
        runner = {r.mode: r for r in self.runners}
        for mode, rate, repeat in self.plan.turns(self.cfg):
            await runner[mode].run_point(rate, repeat)

    async def _later_rounds(self, up: list[_ModeRunner] | None = None) -> None:
        """A search's next rounds on the actors still up (``up``; side by side or in turns, every
        arm's), so that no engine, and no cluster this run started, starts again between rounds.
        Modes run one after the other stop each engine to free its resources: only the last one's
        stays up, for the rounds that need that arm alone; the others' rounds start them again."""
        up = self.runners if up is None else up
        take_round = getattr(self.sink, "take_round", None)
        while take_round is not None:
            work = take_round([r.mode for r in up])
            if work is None:
                return
            self.cfg, self.plan = work
            self.bar.total += self.plan.requests(self.cfg)
            self.bar.refresh()
            if self.turns:
                await self._take_turns()
            else:
                await asyncio.gather(*(r.run_points() for r in up if r.mode in self.cfg.sweep.modes))
