"""Stage: runner.  Replays the dataset at one rate against one engine, and records every request.

A ``ModeSession`` owns one engine (one mode, any backend, through ``engines.Engine`` only) and
runs points on it: reset the prefix cache, prime the group prefixes, send the warm-up requests,
then send the measured requests on the arrival schedule.  It hands on a ``PointResult``: typed
request rows, iteration rows and the point's metadata.  Executors (local, Ray) only decide where
sessions live.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import math
import signal
import threading
import time
import traceback
from dataclasses import asdict, replace
from typing import NamedTuple

import numpy as np
import pandas as pd

from prefixstudy import arrivals
from prefixstudy.cachesim import SentRequest, simulate, simulate_timed
from prefixstudy.config import StudyConfig
from prefixstudy.engines import IterationSample, RequestTrace
from prefixstudy.engines import pool as engine_pool
from prefixstudy.engines.build import make_engine
from prefixstudy.errors import StudyFailed, describe_failure
from prefixstudy.schema import PointResult, RequestRecord, typed_iterations, typed_requests
from prefixstudy.workloads.base import DatasetRow, group_prefixes
from prefixstudy.workloads.trace import trace_offsets


def percentile(ordered: list[float], q: float) -> float:
    """``np.percentile(a, q)`` (its default, linear method) of an ascending list, to the bit: the same
    index, weight and interpolation.  A tenth of numpy's time on a request's ~150 gaps, where numpy's
    per-call overhead was most of a simulated point's record keeping."""
    n = len(ordered)
    index = (q / 100) * (n - 1)
    lo = math.floor(index)
    a, b = ordered[lo], ordered[min(lo + 1, n - 1)]
    weight, diff = index - lo, b - a
    return b - diff * (1 - weight) if weight >= 0.5 else a + diff * weight


def make_record(mode: str, rate: float, index: int, request_id: str, row: DatasetRow, warmup: bool,
                scheduled_s: float, t0: float, tr: RequestTrace, expected: int = 0, estimated: int = 0,
                parent_index: int = -1, repeat: int = 0) -> RequestRecord:
    """Client times are on time.monotonic(); engine stamps are the engine's own monotonic stamps."""
    nan = float("nan")
    times = np.asarray(tr.token_times)
    n = len(times)
    ttft = (times[0] - tr.sent_mono) * 1e3 if n else nan
    e2e = (times[-1] - tr.sent_mono) * 1e3 if n else nan
    # Gaps between tokens are measured only where every token arrived on its own clock reading.
    itl = np.diff(times) * 1e3 if n > 1 and not tr.unstreamed_tokens else np.array([])
    ordered = sorted(itl.tolist())
    itl_p50, itl_p99 = (percentile(ordered, 50), percentile(ordered, 99)) if ordered else (nan, nan)
    error = tr.error
    if not error and n < row.output_len:
        error = f"short output: {n} of {row.output_len} tokens"
    elif not error and n > row.output_len:  # not the work asked for: a server that ignores max_tokens
        error = f"long output: {n} tokens, {row.output_len} asked"

    def span(a: float, b: float) -> float:
        return (b - a) * 1e3 if a > 0 and b > 0 else nan

    return RequestRecord(
        mode=mode, rate=rate, repeat=repeat, request_index=index, request_id=request_id, group=row.group, warmup=warmup,
        prompt_tokens=len(row.prompt_token_ids), output_tokens=n, num_cached_tokens=tr.num_cached_tokens,
        expected_cached_tokens=expected,
        scheduled_s=scheduled_s, sent_s=tr.sent_mono - t0,
        dispatch_lag_ms=(tr.sent_mono - t0 - scheduled_s) * 1e3,
        ttft_ms=ttft, e2e_ms=e2e, tpot_ms=(e2e - ttft) / (n - 1) if n > 1 else nan,
        itl_mean_ms=float(itl.mean()) if len(itl) else nan,
        itl_p50_ms=itl_p50, itl_p99_ms=itl_p99,
        itl_max_ms=float(itl.max()) if len(itl) else nan,
        queue_ms=span(tr.queued_ts, tr.scheduled_ts),
        prefill_ms=span(tr.scheduled_ts, tr.first_token_ts),
        decode_ms=span(tr.first_token_ts, tr.last_token_ts),
        error=error, session=row.session, turn=row.turn, parent_index=parent_index,
        estimated_cached_tokens=estimated, replica=tr.replica,
    )


def iteration_frame(mode: str, rate: float, samples: list[IterationSample], t0: float, repeat: int = 0,
                    timing: str = "engine") -> pd.DataFrame:
    """Engine steps as iteration rows, times in seconds since the point's start ``t0``."""
    df = pd.DataFrame([asdict(s) for s in samples])
    if df.empty:
        return typed_iterations(df)
    df["step_start_s"] = df.pop("start_mono") - t0
    df["t_s"] = df.pop("end_mono") - t0
    df["host_step_ms"] = (df["t_s"] - df["step_start_s"]) * 1e3
    # A step timed on the GPU costs its span there; the host stamps stay beside it.
    gpu = df.pop("gpu_ms").to_numpy(dtype=float)
    timed = np.isfinite(gpu)
    df["step_ms"] = np.where(timed, gpu, df["host_step_ms"])
    df = df.rename(columns={"queried_tokens": "prefix_queries", "sampled_tokens": "generation_tokens"})
    df["prefix_hits"] = df["cached_tokens"]
    df["prompt_tokens"] = df["prefill_tokens"]
    df["mode"], df["rate"], df["repeat"] = mode, rate, repeat
    df["timing"] = np.where(timed, "gpu-span", timing)
    return typed_iterations(df)


def warmup_rows(rows: list[DatasetRow], prefixes: dict[int, list[int]], n: int,
                token_range: tuple[int, int]) -> list[DatasetRow]:
    """Same group prefixes, fresh suffixes drawn from ``token_range`` [lo, hi): warm-ups must not
    pre-cache measured suffixes.  Only first turns serve as models (a later turn's row holds just
    its new user tokens).  The runner and the simulator (``sim.study``) both send these."""
    rng = np.random.default_rng(10_007)
    lo, hi = token_range
    firsts = [r for r in rows if r.parent < 0]
    out = []
    for i in range(n):
        base = firsts[i % len(firsts)]
        keep = len(prefixes.get(base.group, []))
        suffix = rng.integers(lo, hi, size=len(base.prompt_token_ids) - keep).tolist()
        out.append(DatasetRow(f"warmup{i}", base.prompt_token_ids[:keep] + suffix, base.output_len, base.group))
    return out


def point_plan(cfg: StudyConfig, dataset: list[DatasetRow], rate: float,
               repeat: int) -> tuple[list[DatasetRow], list[int], np.ndarray]:
    """A point's rows, each one's parent (point index, -1: none) and send offsets (s; NaN for
    later turns, which are sent when their parent finishes).  First turns take the arrival
    schedule in order; a trace replays its recorded times unless told to draw them.  Each repeat
    draws its own schedule; ON and OFF of one repeat the same one (they are paired by index).
    The runner and the simulator (``sim.study``) both follow it."""
    n, L = cfg.sweep.requests_for(rate), len(dataset)
    rows = [dataset[i % L] for i in range(n)]
    # The dataset wraps around: a parent sits as many rows back as in the dataset.
    parents = [i - (i % L - r.parent) if r.parent >= 0 else -1 for i, r in enumerate(rows)]
    d = cfg.dataset
    offsets = trace_offsets(dataset, n, rate, d.trace.replay if d.trace else "scaled") \
        if d.kind == "trace" else None
    if offsets is None:
        firsts = [i for i in range(n) if parents[i] < 0]
        offsets = np.full(n, np.nan)
        offsets[firsts] = arrivals.schedule(len(firsts), rate, cfg.arrivals.process,
                                            cfg.arrivals.burstiness, cfg.arrivals.seed + repeat)
    return rows, parents, offsets


def token_range(rows: list[DatasetRow]) -> tuple[int, int]:
    """[lo, hi) of the dataset's token ids: warm-up suffixes drawn from it stay valid ids."""
    return min(min(r.prompt_token_ids) for r in rows), max(max(r.prompt_token_ids) for r in rows) + 1


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
        return self

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
        await eng.reset_prefix_cache()
        settle_heap()
        self._sent: list[_Sent] = []
        try:
            records, warmup_s = await self._prime_and_warm_up(rate, repeat)
        except PrimeFailed as e:  # the point cannot run; its planned requests are rows all the same
            why = str(e)
            ids = [self._rid("m", rate, i, repeat) for i in range(n)]
            recs = [make_record(self.mode, rate, i, ids[i], rows[i], False, float(offsets[i]), 0.0,
                                RequestTrace(float("nan"), error=f"not sent: {why}"), parent_index=parents[i],
                                repeat=repeat) for i in range(n)]
            return PointResult(self.mode, rate, typed_requests(pd.DataFrame([asdict(r) for r in recs])),
                               typed_iterations(), {"status": "failed", "error": why, "n_sent": n,
                                                    "started_at": started_at}, repeat)

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
                "num_blocks": eng.num_blocks, "tier_blocks": int(eng.tier_blocks),
                "evicted_blocks_estimated": evicted, **server,
                "prefix_caching": self.caching,
                "itl_ms": itl_summary(gaps, self.cfg.percentiles)}
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


def itl_summary(gaps: list[np.ndarray], percentiles) -> dict[str, float | None]:
    """Every inter-token gap (ms) of a point's counted requests, pooled as `vllm bench serve` pools
    them: median, std and percentiles (keys ``median``, ``std``, ``p<q>``).  requests.parquet keeps
    per-request summaries only, so the point's metadata carries these for the bench export."""
    v = np.concatenate(gaps) if gaps else np.zeros(0)
    if not v.size:
        return {}
    out = {"median": float(np.median(v)), "std": float(v.std())}
    out.update({f"p{int(q) if int(q) == q else q}": float(np.percentile(v, q)) for q in percentiles})
    return out


class Terminated(KeyboardInterrupt):
    """SIGTERM, delivered like Ctrl-C so the same cleanup runs (engines down, points flushed)."""

    signum = signal.SIGTERM


# The signal that asked this process to stop, while ``run_until_signal`` runs a loop (None: none).
# The runner's own cancellations (a point's deadline) leave it None, so a request cancelled by one
# becomes an "unfinished" row, while one cancelled by a signal lets the cancellation through.
_stop: dict[str, int | None] = {"signum": None}
RECANCEL_S = 0.5  # how often a stop is repeated while the main task has not ended


def stop_requested() -> bool:
    return _stop["signum"] is not None


def run_until_signal(main):
    """``asyncio.run(main)``, with SIGINT and SIGTERM taken by the loop (``add_signal_handler``):
    the first one cancels the main task, again every RECANCEL_S until it ends (a library that
    swallows one cancellation cannot keep the run going), and the run then raises
    KeyboardInterrupt (SIGINT) or ``Terminated`` (SIGTERM).  A handler that raised from inside
    the loop's select call instead could leave the loop half-stopped and the sweep running on.
    Off the main thread (a Ray actor's, a notebook's helper) signals are not the loop's to take."""
    pool = engine_pool.active()
    if pool is not None:  # its engines belong to its loop (engines.pool)
        return pool.run(main)
    if threading.current_thread() is not threading.main_thread():
        return asyncio.run(main)
    loop = asyncio.new_event_loop()
    task = loop.create_task(main)
    sigs = (signal.SIGINT, signal.SIGTERM)
    previous = {s: signal.getsignal(s) for s in sigs}
    _stop["signum"] = None

    def again() -> None:
        if not task.done():
            task.cancel()
            loop.call_later(RECANCEL_S, again)

    def on_signal(signum: int) -> None:
        first = _stop["signum"] is None
        _stop["signum"] = _stop["signum"] or signum
        if first:
            again()

    try:
        for s in sigs:
            loop.add_signal_handler(s, on_signal, s)
        try:
            result = loop.run_until_complete(task)
        except BaseException:
            if not stop_requested():
                raise
            result = None  # whatever the cancellation left behind, the signal is the reason to report
        if stop_requested():
            raise (Terminated() if _stop["signum"] == signal.SIGTERM else KeyboardInterrupt()) from None
        return result
    finally:
        try:
            _cancel_rest(loop)
        finally:
            for s in sigs:
                loop.remove_signal_handler(s)
                signal.signal(s, previous[s])  # remove_signal_handler would leave SIG_DFL
            loop.close()
            _stop["signum"] = None


def _cancel_rest(loop: asyncio.AbstractEventLoop) -> None:
    """What asyncio.run does at its end: cancel the tasks still open, let them finish, close the
    async generators."""
    rest = [t for t in asyncio.all_tasks(loop) if not t.done()]
    for t in rest:
        t.cancel()
    if rest:
        loop.run_until_complete(asyncio.gather(*rest, return_exceptions=True))
    loop.run_until_complete(loop.shutdown_asyncgens())
    loop.run_until_complete(loop.shutdown_default_executor())


def settle_heap() -> None:
    """Collect, then freeze what is left, before a point is measured.  torch and vLLM leave ~0.7 M
    objects in this process; one full collection over them took 414 ms on the 2-core machine, and on
    2 x H200 the sending loop (and vLLM's output handling beside it) stalled 400-500 ms wherever one
    fell inside a busy point.  Frozen objects are never scanned again; unfreezing first lets the
    previous point's garbage go.  `vllm bench serve` and vLLM's engine core freeze their heaps too."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()


# The longest single timer sleep.  A timer overshoots in proportion to its length: 0.1 % on this VM's
# asyncio loop, 0.5 % on the uvloop a Ray actor runs (4.5 s slept 22 ms long; benchmarks/timer_overshoot.py),
# which made the sends after long gaps at 1 req/s on Ray TP 2 late by 2-15 ms.  Napping at most 50 ms
# keeps any overshoot to a fraction of the spin margin below.
MAX_NAP_S = 0.05
SPIN_MARGIN_S = 0.0015


async def _sleep_until(target: float) -> None:
    """Sleep in naps of at most MAX_NAP_S until SPIN_MARGIN_S before target, then yield the last
    stretch: asyncio's timer rounds to ~1 ms.  The spin yields with sleep(0), so the loop's other
    work (vLLM's output handling) runs in it; it never takes much of a busy loop's time."""
    while (delay := target - time.monotonic()) > SPIN_MARGIN_S:
        await asyncio.sleep(min(delay - SPIN_MARGIN_S, MAX_NAP_S))
    while time.monotonic() < target:
        await asyncio.sleep(0)
