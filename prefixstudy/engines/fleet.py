"""A mode's fleet: ``replicas`` engines, each with its own prefix cache, behind one router.

``FleetEngine`` implements the engine protocol, so the runner drives a fleet exactly as it drives
one engine (reset, prime, warm up, dispatch); every request it is given, primes and warm-ups
included, goes where ``prefixstudy.engines.router`` says, and the request's trace and the replica's
engine steps carry the replica's index (``replica`` in requests and iterations).

The router runs beside the load generator, in its process and on its event loop: a routing decision
costs no network hop.  Where the replicas live is the factory's business: ``LocalReplicas`` builds
them in this process (any in-process backend; the unit tests use echo), the Ray executor's
``executors.ray_fleet.RayReplicas`` one Ray actor per replica, each on its own placement group.

A replica lost during a point (its actor or engine died) fails only the requests routed to it,
each a row with the cause; the others go on, and the point is marked failed (``error`` names the
replica) so ``--resume`` runs it again.  The router keeps its policy for the rest of the point (the
point measures the fleet it started with), and a fresh replica replaces the lost one before the next
point.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from dataclasses import replace
from typing import Any, Protocol

from prefixstudy.engines.base import EngineDefaults, IterationSample, RequestTrace
from prefixstudy.engines.registry import engine_class
from prefixstudy.errors import StudyFailed, describe_failure
from prefixstudy.engines.router import Router


class ReplicaLost(RuntimeError):
    """A request's replica is gone (its actor or engine died); the message names it and why."""


class Replica(Protocol):
    """One engine of a fleet, as the fleet sees it.  ``info`` (where it runs) is known after start."""

    info: dict
    block_size: int
    num_blocks: int
    step_timing: str
    async_scheduling: bool | None

    async def start(self) -> None: ...

    async def reset_prefix_cache(self) -> None: ...

    async def begin(self) -> None:
        """Start recording engine steps (right before the measured requests)."""

    async def end(self) -> list[IterationSample]:
        """Stop recording; the steps since ``begin``, on this process's monotonic clock."""

    async def generate(self, prompt: list[int], output_len: int, request_id: str, trace: RequestTrace) -> RequestTrace:
        """As ``Engine.generate``; raises ReplicaLost when the replica is gone."""

    def is_dead(self) -> bool: ...

    def shutdown(self) -> None: ...


class LocalReplica:
    """A replica in this process: one engine of the study's backend."""

    def __init__(self, engine):
        self.engine = engine
        self.info: dict = {}

    async def start(self) -> None:
        await self.engine.start()
        e = self.engine
        self.block_size, self.num_blocks = e.block_size, e.num_blocks
        self.step_timing, self.async_scheduling = e.step_timing, e.async_scheduling
        self.info = {"pid": os.getpid(), "host": socket.gethostname(), "startup_s": e.startup_s}

    async def reset_prefix_cache(self) -> None:
        await self.engine.reset_prefix_cache()

    async def begin(self) -> None:
        self.engine.begin_iterations()

    async def end(self) -> list[IterationSample]:
        return self.engine.end_iterations()

    async def generate(self, prompt, output_len, request_id, trace):
        return await self.engine.generate(prompt, output_len, request_id, trace)

    def is_dead(self) -> bool:
        return self.engine.is_dead()

    def shutdown(self) -> None:
        self.engine.shutdown()


class LocalReplicas:
    """Builds in-process replicas (executor local): ``make(i, generation)``."""

    def __init__(self, cfg, mode: str, ray_workers: bool = False):
        self.cfg, self.mode, self.ray_workers = cfg, mode, ray_workers

    def make(self, replica: int, generation: int) -> Replica:
        cfg = self.cfg
        return LocalReplica(engine_class(cfg.engine.kind)(cfg.model, cfg.arm_engine(self.mode), self.mode,
                                                          ray_workers=self.ray_workers))


class FleetEngine(EngineDefaults):
    """``cfg.replicas`` replicas of one mode behind a ``Router`` (``cfg.router``, one policy: a run
    with more is refused by ``preflight.check_inputs``; a routing or capacity sweep gives each policy its
    own run)."""

    kind = "fleet"  # what the runner drives, never a config's engine.kind: the replicas' backend is that

    def __init__(self, cfg, mode: str, factory):
        self.cfg, self.mode, self.factory = cfg, mode, factory
        self.n = cfg.replicas
        self.policy = cfg.router.policies[0]
        self.replicas: list[Replica | None] = [None] * self.n
        self.generations = [0] * self.n
        self.started: list[dict] = []  # every replica started (replacements too): the manifest's record
        self.lost: dict[int, str] = {}  # replica -> why, during the current point
        self.routed = [0] * self.n
        self._samples: list[IterationSample] = []
        self.block_size, self.num_blocks, self.startup_s, self.step_timing = 16, 0, 0.0, "engine"
        self.router: Router | None = None

    async def _start(self, i: int) -> None:
        r = self.factory.make(i, self.generations[i])
        self.replicas[i] = r
        try:
            await r.start()
        except Exception as e:  # which replica, and its log when a Ray actor read it (executors.own_log)
            log = getattr(e, "log", "")
            raise StudyFailed(f"replica {i}: {describe_failure(e, log)}", log=log) from e
        self.started.append({"replica": i, "generation": self.generations[i], **r.info})

    async def start(self) -> None:
        t0 = time.monotonic()
        for i in range(self.n):  # one at a time: engines compiling side by side skew each other (and vLLM 0.26's ports)
            await self._start(i)
        first = self.replicas[0]
        self.block_size, self.num_blocks, self.step_timing = first.block_size, first.num_blocks, first.step_timing
        self.async_scheduling = first.async_scheduling
        rc = self.cfg.router
        self.router = Router(self.n, self.policy, self.block_size, rc.prefix_blocks, rc.load_bound)
        self.startup_s = time.monotonic() - t0

    async def _replace_lost(self) -> None:
        for i, r in enumerate(self.replicas):
            if r is None or r.is_dead():
                if r is not None:
                    r.shutdown()
                self.generations[i] += 1
                await self._start(i)

    async def reset_prefix_cache(self) -> None:
        """A new point: replace replicas lost in the last one, empty every cache, reset the router."""
        await self._replace_lost()
        await asyncio.gather(*(r.reset_prefix_cache() for r in self.replicas))
        self.router.reset()
        self.lost, self.routed = {}, [0] * self.n

    async def begin_point(self) -> None:
        async def begin(i: int, r) -> None:
            try:
                await r.begin()
            except ReplicaLost as e:  # lost before the point began: its requests fail, the rest go on
                self.lost.setdefault(i, str(e))

        await asyncio.gather(*(begin(i, r) for i, r in enumerate(self.replicas)))

    def begin_iterations(self) -> None:
        pass  # begin_point started every replica's recording

    async def end_point(self) -> dict[str, Any]:
        """Collect every living replica's steps; the point's metadata: where each replica ran, how
        many requests it was routed, the router's spills, and a lost replica as the point's error."""
        samples = []
        for i, r in enumerate(self.replicas):
            if i in self.lost or r.is_dead():
                continue
            try:
                samples += [replace(s, replica=i) for s in await r.end()]
            except ReplicaLost as e:
                self.lost.setdefault(i, str(e))
        self._samples = sorted(samples, key=lambda s: s.start_mono)
        meta: dict[str, Any] = {
            "router": {"policy": self.policy, "replicas": self.n, "spills": self.router.spills},
            "replicas": [{"replica": i, "generation": self.generations[i], "routed": self.routed[i],
                          **{k: r.info.get(k) for k in ("pid", "node_id", "pg_node_id") if k in r.info}}
                         for i, r in enumerate(self.replicas)],
        }
        if self.lost:
            meta["status"] = "failed"
            meta["error"] = "; ".join(f"replica {i} lost during the point: {why}" for i, why in sorted(self.lost.items()))
        return meta

    def end_iterations(self) -> list[IterationSample]:
        out, self._samples = self._samples, []
        return out

    async def generate(self, prompt_token_ids: list[int], output_len: int, request_id: str,
                       trace: RequestTrace) -> RequestTrace:
        i = self.router.pick(prompt_token_ids)
        trace.replica = i
        self.routed[i] += 1
        r = self.replicas[i]
        try:
            return await r.generate(prompt_token_ids, output_len, request_id, trace)
        except ReplicaLost as e:
            self.lost.setdefault(i, str(e))
            raise
        except Exception as e:
            if r.is_dead():  # an in-process engine that died: the replica is lost, not just the request
                self.lost.setdefault(i, f"{type(e).__name__}: {e}"[:300])
            raise
        finally:
            self.router.done(i)

    async def probe(self, prompt_token_ids: list[int], request_id: str) -> list[RequestTrace]:
        """The probe goes to every replica, past the router: each replica's cache is checked (a
        replica lost in the last point is replaced first, as a reset would)."""
        await self._replace_lost()

        async def one(i: int, r) -> RequestTrace:
            trace = RequestTrace(time.monotonic(), replica=i)
            return await r.generate(prompt_token_ids, 1, f"{request_id}-replica{i}", trace)

        return list(await asyncio.gather(*(one(i, r) for i, r in enumerate(self.replicas))))

    def set_cache_salt(self, salt: str) -> None:
        raise NotImplementedError("a fleet resets each replica's cache; cache_isolation salt is refused for it "
                                  "(preflight.check_isolation)")

    def is_dead(self) -> bool:
        """Only a fleet with no replica left is dead (the executor then restarts it whole)."""
        return all(r is None or r.is_dead() for r in self.replicas)

    def shutdown(self) -> None:
        for r in self.replicas:
            if r is not None:
                r.shutdown()
