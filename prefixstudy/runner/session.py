"""``ModeSession``: one engine (one mode, any backend, through ``engines.Engine`` only), warmed up
once it starts until its step time settles (``runner.warmup``), and the points run on it: reset
(or salt) the prefix cache and prove it cold with a probe (``runner.cold``), prime the group
prefixes, send the point's warm-up requests, then send the measured requests on the arrival
schedule, and estimate what the cache should have served."""

from __future__ import annotations

import asyncio
import contextlib
import time
import traceback
from dataclasses import asdict, replace
from typing import NamedTuple

import numpy as np
import pandas as pd

from prefixstudy.engines.cachesim import SentRequest, simulate, simulate_timed
from prefixstudy.config import StudyConfig
from prefixstudy.engines import RequestTrace
from prefixstudy.engines import pool as engine_pool
from prefixstudy.runner.engine_build import make_engine
from prefixstudy.engines.registry import capabilities
from prefixstudy.errors import StudyFailed, describe_failure
from prefixstudy.runner.cold import ColdStart, ColdStartFailed
from prefixstudy.runner.pacing import _sleep_until, settle_heap
from prefixstudy.runner.plan import point_plan, token_range, warmup_rows
from prefixstudy.runner.records import iteration_frame, itl_summary, make_record
from prefixstudy.runner.signals import stop_requested
from prefixstudy.runner.warmup import batch_gap_ms, settled, skipped
from prefixstudy.shared.machine import engine_machine
from prefixstudy.schema import PointResult, RequestRecord, typed_iterations, typed_requests
from prefixstudy.workloads.base import DatasetRow, group_prefixes


class ModeSession:
    """One engine, one mode, many points.  Use as ``async with``."""

    def __init__(self, cfg: StudyConfig, mode: str, rows: list[DatasetRow], progress=None,
                 ray_workers: bool = False, replica_factory=None, own_log=None):
        self.cfg, self.mode, self.rows = cfg, mode, rows
        self.caching = cfg.arm(mode).prefix_caching
        self.own_log = own_log  # a Ray actor's: its engine's output, read when the start fails (executors.own_log)
        self.ray_workers = ray_workers  # the engine sits in a Ray placement group (see make_engine)
        self.replica_factory = replica_factory  # cfg.replicas > 1: where the fleet's replicas live
        self.engine = make_engine(cfg, mode, ray_workers=ray_workers, replica_factory=replica_factory)
        self.prefixes = group_prefixes(rows)
        self.token_range = token_range(rows)
        self.progress = progress  # callable(n_done) or None
        self._seq = 0
        self._sent: list[_Sent] = []
        self.cold = ColdStart(cfg.sweep.cache_isolation, mode, rows, self.caching, cfg.engine.max_model_len)
        self.warmup: dict = {}  # what the last warm-up did (runner.warmup), for the manifest's `engines`
        self.machine: dict = {}  # where the engine runs, in every point's metadata (summary.csv's host, gpu_uuid, ...)

    async def __aenter__(self) -> "ModeSession":
        try:
            self.engine = await engine_pool.start_engine(self.engine)
        except Exception as e:
            # One line for the user, not the launcher's traceback.  vLLM's own reason (e.g. a KV
            # cache too small for max_model_len) is in the engine's log: on the console here, or
            # read back from a Ray actor's files and named in the line as its root cause.
            with contextlib.suppress(Exception):  # what half-started is stopped; the start's error is the one to show
                self.engine.shutdown()
            log = getattr(e, "log", "") or (self.own_log.since() if self.own_log is not None else "")
            hint = "" if log else "; -v shows the engine's own log"
            raise StudyFailed(f"cache {self.mode.upper()}: the engine did not start ({describe_failure(e, log)}){hint}",
                              log=log) from e
        self.machine = self._machine()
        await self._warm_up_or_close()
        return self

    def _machine(self) -> dict:
        """Where the engine runs (shared.machine.engine_machine), asked once it started.  A Ray
        actor whose vLLM workers hold the GPUs, or a fleet of Ray replicas, names no one GPU."""
        can = capabilities(self.cfg.engine.kind)
        exact = can.gpus_in_process or not (self.ray_workers or self.replica_factory)
        return engine_machine(can.gpu and self.cfg.device != "cpu" and self.replica_factory is None,
                              here=not can.remote, exact=exact)

    async def _warm_up_or_close(self) -> None:
        try:
            self.warmup = await self.warm_up()
        except BaseException:  # Ctrl-C in the warm-up: the engine started here is stopped here
            await self.__aexit__(None, None, None)
            raise

    async def warm_up(self) -> dict:
        """Batches of ``sweep.engine_warmup.batch_requests`` requests sent at once, with fresh
        suffixes, until the engine's step time settles (``runner.warmup.settled``) or
        ``max_batches``.  Each request has ``request_timeout_s``; one that fails ends the warm-up
        (the first point will fail or not on its own), so a stalling engine holds it one timeout
        long.  Returns its record."""
        w = self.cfg.sweep.engine_warmup
        if w.max_batches == 0:
            return skipped("sweep.engine_warmup.max_batches is 0")
        if not capabilities(self.cfg.engine.kind).shared_steps:
            return skipped(f"engine.kind {self.cfg.engine.kind} forms no engine steps to settle")
        if self.cfg.replicas > 1:
            return skipped("a fleet's replicas are reached through its router; each point's warm-ups warm them")
        rows = warmup_rows(self.rows, self.prefixes, w.batch_requests * w.max_batches, self.token_range)
        t0 = time.monotonic()
        gaps: list[float] = []
        stopped, sent = "max_batches", 0
        for b in range(w.max_batches):
            batch = rows[b * w.batch_requests:(b + 1) * w.batch_requests]
            traces = await asyncio.gather(*(self._one(row, self._rid("engine-warmup", 0, sent + i), time.monotonic())
                                            for i, row in enumerate(batch)))
            sent += len(batch)
            errors = [t.error for t in traces if t.error]
            if errors:
                stopped = f"failed: {errors[0][:200]}"
                break
            gaps.append(batch_gap_ms(traces))
            if settled(gaps, w.tolerance):
                stopped = "settled"
                break
        self._sent = []  # the warm-up's requests stay out of every point's cache estimate
        return {"settled": stopped == "settled", "stopped": stopped, "batches": len(gaps), "requests": sent,
                "gap_ms": [round(g, 4) for g in gaps], "s": round(time.monotonic() - t0, 3),
                "batch_requests": w.batch_requests, "tolerance": w.tolerance}

    async def __aexit__(self, *exc) -> None:
        await self.engine.aclose()
        engine_pool.stop_engine(self.engine)

    async def restart(self) -> None:
        """After the engine died in a point: a fresh one.  One that does not come back stops the
        run (StudyFailed: its points so far are saved, --resume goes on), whatever the reason; a
        server that went away is no bad input of the user's."""
        await self.engine.aclose()
        engine_pool.stop_engine(self.engine)
        self.engine = make_engine(self.cfg, self.mode, ray_workers=self.ray_workers,
                                  replica_factory=self.replica_factory)
        try:
            self.engine = await engine_pool.start_engine(self.engine)
        except Exception as e:
            with contextlib.suppress(Exception):
                self.engine.shutdown()
            raise StudyFailed(f"cache {self.mode.upper()}: the engine died and did not come back "
                              f"({describe_failure(e, getattr(e, 'log', ''))})", log=getattr(e, "log", "")) from e
        self.warmup = await self.warm_up()

    def _rid(self, kind: str, rate: float, i: int, repeat: int = 0) -> str:
        self._seq += 1  # request ids stay unique across points on one engine
        return f"{self.mode}-{rate:g}-r{repeat}-{kind}{i}-{self._seq}"

    async def run_point(self, rate: float, repeat: int = 0) -> PointResult:
        try:
            return await self._run_point(rate, repeat)
        except Exception as e:  # noqa: BLE001 - the engine died or refused: the point is a failed row, the sweep goes on
            return PointResult.failed(self.mode, rate, f"{type(e).__name__}: {e}", repeat,
                                      traceback=traceback.format_exc(limit=5))

    async def _run_point(self, rate: float, repeat: int) -> PointResult:
        eng = self.engine
        rows, parents, offsets = point_plan(self.cfg, self.rows, rate, repeat)
        n = len(rows)
        started_at = time.time()
        self._sent: list[_Sent] = []
        try:
            # Reset (or salt) the cache and prove it cold; the probe stays out of every measurement.
            cold, probe, after = await self.cold.isolate(eng, self._probe, lambda kind: self._rid(kind, rate, 0, repeat))
            settle_heap()
            for tr in after:  # the probe's blocks stay cached: the cache estimate replays them
                self._sent.append(_Sent(tr.sent_mono, -1, SentRequest(probe, tr.output_token_ids or None, 1),
                                        *_held_span(tr), tr.replica))
            records, warmup_s = await self._prime_and_warm_up(rate, repeat)
        except (PrimeFailed, ColdStartFailed) as e:  # the point cannot run; its planned requests are rows all the same
            why = str(e)
            ids = [self._rid("m", rate, i, repeat) for i in range(n)]
            recs = [make_record(self.mode, rate, i, ids[i], rows[i], False, float(offsets[i]), 0.0,
                                RequestTrace(float("nan"), error=f"not sent: {why}"), parent_index=parents[i],
                                repeat=repeat) for i in range(n)]
            probe_meta = e.meta if isinstance(e, ColdStartFailed) else cold
            return PointResult(self.mode, rate, typed_requests(pd.DataFrame([asdict(r) for r in recs])),
                               typed_iterations(), {"status": "failed", "error": why, "n_sent": n,
                                                    "started_at": started_at, **probe_meta, **self.machine}, repeat)

        await eng.begin_point()
        eng.begin_iterations()
        t0 = time.monotonic()
        ids = [self._rid("m", rate, i, repeat) for i in range(n)]
        point = _Point(rows, parents, offsets, ids, t0)
        tasks = await self._dispatch(point)
        duration_s = time.monotonic() - t0
        # end_point first: a fleet of remote replicas collects their steps there (a sync
        # end_iterations cannot wait for them); the HTTP backends' scrape does not mind the order.
        server = await eng.end_point()
        samples = eng.end_iterations()
        exp, est, evicted = self._cache_estimates(n)
        gaps = []
        for i in range(n):
            # Requests the deadline stopped before they were sent are still rows: never dropped.
            tr = tasks[i].result() if i < len(tasks) else \
                RequestTrace(float("nan"), error="unfinished: not sent before max_point_duration_s")
            row = replace(rows[i], prompt_token_ids=point.prompts[i]) if point.prompts[i] else rows[i]
            records.append(make_record(self.mode, rate, i, ids[i], row, False, float(point.scheduled_s[i]), t0, tr,
                                       exp[i], est[i], parents[i], repeat))
            if records[-1].error == "" and not tr.unstreamed_tokens:  # its gaps are not measured (make_record)
                gaps.append(np.diff(tr.token_times) * 1e3)
        dead = eng.is_dead()
        timing = eng.step_timing
        meta = {"status": "failed" if dead else "ok", "error": "engine died during the point" if dead else "",
                "n_sent": n, "started_at": started_at, "duration_s": duration_s, "warmup_s": warmup_s,
                "block_size": eng.block_size, "engine_startup_s": eng.startup_s, "step_timing": timing,
                "async_scheduling": eng.async_scheduling,
                "num_blocks": eng.num_blocks, "tier_blocks": int(eng.tier_blocks),
                "evicted_blocks_estimated": evicted, **server,
                "prefix_caching": self.caching, **cold,
                "itl_ms": itl_summary(gaps, self.cfg.percentiles), **self.machine}
        req = typed_requests(pd.DataFrame([asdict(r) for r in records]))
        its = iteration_frame(self.mode, rate, samples, t0, repeat, timing)
        return PointResult(self.mode, rate, req, its, meta, repeat)

    def _cache_estimates(self, n: int) -> tuple[list[int], list[int], int]:
        """Per measured request, the prompt tokens ON should serve from an infinite cache (the
        upper bound: each request alone, in send order) and from the engine's own number of blocks
        (LRU, ``cachesim.simulate_timed``: each request holding its blocks from when the engine
        scheduled it to its last token), both with the engine's CPU tier where it has one (its
        ``tier_blocks``; the bound's unbounded), replaying every request of the point (primes and warm-ups
        too); and the blocks that estimate evicted.  OFF: zeros."""
        if not self.caching:
            return [0] * n, [0] * n, 0
        exp_i, est_i, evicted = [0] * n, [0] * n, 0
        # A CPU tier (offload blocks, 0: none) under the GPU pool: the bound gets an unbounded one.
        tier = int(self.engine.tier_blocks)
        # Each replica of a fleet has its own cache: replay what each one was sent, apart.
        for replica in sorted({x.replica for x in self._sent}):
            sent = sorted((x for x in self._sent if x.replica == replica), key=lambda x: x.sent)
            inf, _ = simulate([x.request for x in sent], self.engine.block_size, None, None if tier else 0)
            est, ev = simulate_timed([(x.start, x.end, x.request) for x in sent], self.engine.block_size,
                                     self.engine.num_blocks or None, tier)
            evicted += ev
            for k, x in enumerate(sent):
                if x.index >= 0:
                    exp_i[x.index], est_i[x.index] = inf[k], est[k]
        return exp_i, est_i, evicted

    async def _prime_and_warm_up(self, rate: float, repeat: int) -> tuple[list[RequestRecord], float]:
        """Each group's prefix once (so ON's first measured request can hit), then the warm-ups,
        recorded apart.  Returns their records and the warm-up seconds."""
        # Their own deadline, as long as the point's: a stalling server cannot hold a point in its
        # primes and warm-ups for their number x request_timeout_s.
        deadline = time.monotonic() + self.cfg.sweep.max_point_duration_s
        if self.cfg.sweep.prime_prefixes:
            for g, prefix in sorted(self.prefixes.items()):
                if prefix:
                    tr = await self._one(DatasetRow("prime", prefix, 1, g), self._rid("prime", rate, g, repeat),
                                         time.monotonic(), deadline=deadline)
                    if tr.error:  # an engine that cannot run its prime cannot run the point
                        raise PrimeFailed(f"priming group {g} failed ({tr.error})")
        records: list[RequestRecord] = []
        tw = time.monotonic()
        wrows = warmup_rows(self.rows, self.prefixes, self.cfg.sweep.warmup_requests, self.token_range)
        for i, row in enumerate(wrows):
            rid = self._rid("warmup", rate, i, repeat)
            tr = await self._one(row, rid, time.monotonic(), deadline=deadline) if time.monotonic() < deadline else \
                RequestTrace(float("nan"), error=f"unfinished: not sent, {WARMUP_LATE}")
            records.append(make_record(self.mode, rate, i, rid, row, True, float("nan"), tw, tr, repeat=repeat))
        return records, time.monotonic() - tw

    async def _dispatch(self, p: "_Point") -> list[asyncio.Task]:
        """Send each first turn at its scheduled time, and each later turn when its parent is done;
        wait for all, up to the point's deadline, then cancel what is still open.  Returns one
        finished task per request sent (or waiting for its parent)."""
        deadline = p.t0 + self.cfg.sweep.max_point_duration_s
        limit = self.cfg.sweep.max_concurrency
        slots = asyncio.Semaphore(limit) if limit else None
        tasks: list[asyncio.Task] = []
        for i, row in enumerate(p.rows):
            if p.parents[i] >= 0:
                tasks.append(asyncio.create_task(self._after_parent(p, i, tasks[p.parents[i]])))
            else:
                target = p.t0 + p.offsets[i]
                if target > deadline:
                    break
                await _sleep_until(target)
                p.prompts[i] = row.prompt_token_ids
                send = self._one(row, p.ids[i], time.monotonic(), i) if slots is None \
                    else self._one_in_slot(row, p.ids[i], slots, i)
                tasks.append(asyncio.create_task(send))
            if self.progress:
                tasks[-1].add_done_callback(lambda _: self.progress(1))
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=max(0.0, deadline - time.monotonic()))
            for t in pending:
                t.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        return tasks

    async def _after_parent(self, p: "_Point", i: int, parent: asyncio.Task) -> RequestTrace:
        """A later turn: wait for the parent (the runner's one rule of dependence), then its think
        time, then send the parent's prompt + its generated tokens + this turn's new tokens."""
        row = p.rows[i]
        try:
            await asyncio.wait({parent})  # not `await parent`: cancelling this turn must not cancel it
            ptr = parent.result()
            if ptr.error or not ptr.token_times:
                why = ptr.error or "no tokens"
                kind = "unfinished" if why.startswith("unfinished") else "parent failed"
                return RequestTrace(float("nan"), error=f"{kind}: not sent, its parent did not finish ({why[:200]})")
            p.scheduled_s[i] = ptr.token_times[-1] + row.think_time_s - p.t0
            await _sleep_until(p.t0 + p.scheduled_s[i])
        except asyncio.CancelledError:
            if stop_requested():
                raise
            return RequestTrace(float("nan"), error="unfinished: cancelled at max_point_duration_s")
        p.prompts[i] = p.prompts[p.parents[i]] + ptr.output_token_ids + row.prompt_token_ids
        return await self._one(replace(row, prompt_token_ids=p.prompts[i]), p.ids[i], time.monotonic(), i)

    async def _probe(self, prompt: list[int], request_id: str) -> list[RequestTrace]:
        """The cold-start probe (runner.cold) to every cache of the engine, within request_timeout_s."""
        return await asyncio.wait_for(self.engine.probe(prompt, request_id), timeout=self.cfg.sweep.request_timeout_s)

    async def _one_in_slot(self, row: DatasetRow, rid: str, slots: asyncio.Semaphore, index: int) -> RequestTrace:
        """sweep.max_concurrency (a closed loop at rate inf): the request is sent when a slot frees,
        and that is its send time, so its dispatch lag says how long it waited for one."""
        try:
            await slots.acquire()
        except asyncio.CancelledError:
            if stop_requested():
                raise
            return RequestTrace(float("nan"), error="unfinished: no free slot (max_concurrency) before max_point_duration_s")
        try:
            return await self._one(row, rid, time.monotonic(), index)
        finally:
            slots.release()

    async def _one(self, row: DatasetRow, rid: str, sent: float, index: int = -1,
                   deadline: float | None = None) -> RequestTrace:
        """One request, within request_timeout_s (and ``deadline``, a monotonic time, if given)."""
        tr = RequestTrace(sent)
        timeout = self.cfg.sweep.request_timeout_s
        late = deadline is not None and deadline - time.monotonic() < timeout
        if late:
            timeout = max(0.0, deadline - time.monotonic())
        try:
            await asyncio.wait_for(self.engine.generate(row.prompt_token_ids, row.output_len, rid, tr),
                                   timeout=timeout)
        except asyncio.TimeoutError:
            tr.error = f"unfinished: {WARMUP_LATE}" if late else \
                f"unfinished: request_timeout_s ({self.cfg.sweep.request_timeout_s:g} s) passed"
        except asyncio.CancelledError:
            if stop_requested():  # Ctrl-C / SIGTERM: the run stops, this is no point's deadline
                raise
            tr.error = "unfinished: cancelled at max_point_duration_s"
        except Exception as e:  # noqa: BLE001 - any engine error is a failed row, never a crash
            tr.error = f"{type(e).__name__}: {e}".strip()[:500]
        # What the engine saw, for the cache estimates (ids it generated, where the backend says).
        self._sent.append(_Sent(sent, index, SentRequest(row.prompt_token_ids, tr.output_token_ids or None,
                                                         max(len(tr.token_times), 1)), *_held_span(tr), tr.replica))
        return tr


WARMUP_LATE = "the primes and warm-ups passed max_point_duration_s"


class PrimeFailed(Exception):
    """A group's prime request failed: the point is not run."""


class _Point:
    """One point's plan and what dispatch learns: each request's prompt as sent (a later turn's
    only once its parent is done) and scheduled time (a later turn's: parent done + think time)."""

    def __init__(self, rows: list[DatasetRow], parents: list[int], offsets: np.ndarray, ids: list[str], t0: float):
        self.rows, self.parents, self.ids, self.t0 = rows, parents, ids, t0
        self.offsets = offsets
        self.scheduled_s = np.array(offsets, dtype=float)
        self.prompts: list[list[int]] = [[] for _ in rows]


class _Sent(NamedTuple):
    """What one request of a point put in a replica's cache, for ``_cache_estimates``."""

    sent: float  # client send time
    index: int  # measured request index, -1 for primes and warm-ups
    request: SentRequest
    start: float  # when it held KV blocks (_held_span)
    end: float
    replica: int


def _held_span(tr: RequestTrace) -> tuple[float, float]:
    """When the request held KV blocks: from the engine's scheduled stamp (blocks are taken when
    the scheduler admits it, not when it was sent) to its last token.  The engine's stamps share the
    host's monotonic clock; where one is missing or implausible, the client's times stand in."""
    now = time.monotonic()
    end_client = tr.token_times[-1] if tr.token_times else now
    start = tr.scheduled_ts if tr.sent_mono - 1.0 <= tr.scheduled_ts <= now + 1.0 else tr.sent_mono
    end = tr.last_token_ts if start <= tr.last_token_ts <= now + 1.0 else end_client
    return start, max(start, end)
