"""Stage: runner.  Replays the dataset at one rate against one engine, and records every request.

A ``ModeSession`` owns one engine (one mode) and runs points on it: reset the prefix cache,
prime the group prefixes, send the warm-up requests, then send the measured requests on the
arrival schedule.  It hands on a ``PointResult``: typed request rows, iteration rows and the
point's metadata.  Executors (local, Ray) only decide where sessions live.
"""

from __future__ import annotations

import asyncio
import gc
import math
import time
import traceback
from dataclasses import asdict, dataclass, field

import numpy as np
import pandas as pd

from prefixstudy import arrivals
from prefixstudy.config import StudyConfig
from prefixstudy.dataset import DatasetRow
from prefixstudy.engine import Engine, IterationSample, RequestTrace
from prefixstudy.results import typed_iterations, typed_requests


@dataclass
class RequestRecord:
    """One row of requests.parquet (schema.REQUEST_COLUMNS)."""

    mode: str
    rate: float
    request_index: int
    request_id: str
    group: int
    warmup: bool
    prompt_tokens: int
    output_tokens: int
    num_cached_tokens: int
    expected_cached_tokens: int
    scheduled_s: float
    sent_s: float
    dispatch_lag_ms: float
    ttft_ms: float
    tpot_ms: float
    e2e_ms: float
    itl_mean_ms: float
    itl_p50_ms: float
    itl_p99_ms: float
    itl_max_ms: float
    queue_ms: float
    prefill_ms: float
    decode_ms: float
    error: str


@dataclass
class PointResult:
    mode: str
    rate: float
    requests: pd.DataFrame
    iterations: pd.DataFrame
    meta: dict = field(default_factory=dict)  # status, error, duration_s, hit_rate_expected, ...


def make_record(mode: str, rate: float, index: int, request_id: str, row: DatasetRow, warmup: bool,
                scheduled_s: float, t0: float, tr: RequestTrace, expected: int = 0) -> RequestRecord:
    """Client times are on time.monotonic(); engine stamps are the engine's own monotonic stamps."""
    nan = float("nan")
    times = np.asarray(tr.token_times)
    n = len(times)
    ttft = (times[0] - tr.sent_mono) * 1e3 if n else nan
    e2e = (times[-1] - tr.sent_mono) * 1e3 if n else nan
    itl = np.diff(times) * 1e3 if n > 1 else np.array([])
    error = tr.error
    if not error and n < row.output_len:
        error = f"short output: {n} of {row.output_len} tokens"

    def span(a: float, b: float) -> float:
        return (b - a) * 1e3 if a > 0 and b > 0 else nan

    return RequestRecord(
        mode=mode, rate=rate, request_index=index, request_id=request_id, group=row.group, warmup=warmup,
        prompt_tokens=len(row.prompt_token_ids), output_tokens=n, num_cached_tokens=tr.num_cached_tokens,
        expected_cached_tokens=expected,
        scheduled_s=scheduled_s, sent_s=tr.sent_mono - t0,
        dispatch_lag_ms=(tr.sent_mono - t0 - scheduled_s) * 1e3,
        ttft_ms=ttft, e2e_ms=e2e, tpot_ms=(e2e - ttft) / (n - 1) if n > 1 else nan,
        itl_mean_ms=float(itl.mean()) if len(itl) else nan,
        itl_p50_ms=float(np.percentile(itl, 50)) if len(itl) else nan,
        itl_p99_ms=float(np.percentile(itl, 99)) if len(itl) else nan,
        itl_max_ms=float(itl.max()) if len(itl) else nan,
        queue_ms=span(tr.queued_ts, tr.scheduled_ts),
        prefill_ms=span(tr.scheduled_ts, tr.first_token_ts),
        decode_ms=span(tr.first_token_ts, tr.last_token_ts),
        error=error,
    )


def iteration_frame(mode: str, rate: float, samples: list[IterationSample], t0: float) -> pd.DataFrame:
    df = pd.DataFrame([asdict(s) for s in samples])
    if df.empty:
        return typed_iterations(df)
    df["t_s"] = df.pop("t_mono") - t0
    df["step_ms"] = df["t_s"].diff() * 1e3
    df.insert(0, "mode", mode)
    df.insert(1, "rate", rate)
    return typed_iterations(df)


def block_floor(n: int, block: int) -> int:
    return (n // block) * block


def group_prefixes(rows: list[DatasetRow]) -> dict[int, list[int]]:
    """The tokens every prompt of a group shares (the fixed instruction), per group."""
    out: dict[int, list[int]] = {}
    for r in rows:
        p = out.get(r.group)
        if p is None:
            out[r.group] = list(r.prompt_token_ids)
            continue
        m = min(len(p), len(r.prompt_token_ids))
        a, b = np.asarray(p[:m]), np.asarray(r.prompt_token_ids[:m])
        d = np.nonzero(a != b)[0]
        del p[int(d[0]) if len(d) else m:]
    # A group of one request shares nothing with anyone.
    counts = pd.Series([r.group for r in rows]).value_counts()
    return {g: (p if counts[g] > 1 else []) for g, p in out.items()}


def expected_cached(rows: list[DatasetRow], prefixes: dict[int, list[int]], block: int, warm_groups: set[int]) -> list[int]:
    """Prompt tokens ON should serve from cache: the block-aligned shared prefix, once a request of
    its group has been through the engine in this point (primed, warm-up, or an earlier request)."""
    seen = set(warm_groups)
    out = []
    for r in rows:
        shared = min(len(prefixes.get(r.group, [])), len(r.prompt_token_ids) - 1)
        out.append(block_floor(shared, block) if r.group in seen else 0)
        seen.add(r.group)
    return out


class ModeSession:
    """One engine, one mode, many points.  Use as ``async with``."""

    def __init__(self, cfg: StudyConfig, mode: str, rows: list[DatasetRow], progress=None,
                 extra_args: dict | None = None):
        self.cfg, self.mode, self.rows = cfg, mode, rows
        self.extra_args = extra_args  # engine args the executor adds (Ray: distributed_executor_backend)
        self.engine = Engine(cfg, mode, extra_args)
        self.prefixes = group_prefixes(rows)
        # Warm-up suffixes are drawn from the dataset's own token range, so they stay valid ids.
        self.token_range = (min(min(r.prompt_token_ids) for r in rows),
                            max(max(r.prompt_token_ids) for r in rows) + 1)
        self.progress = progress  # callable(n_done) or None
        self._seq = 0

    async def __aenter__(self) -> "ModeSession":
        await self.engine.start()
        return self

    async def __aexit__(self, *exc) -> None:
        self.engine.shutdown()

    async def restart(self) -> None:
        self.engine.shutdown()
        self.engine = Engine(self.cfg, self.mode, self.extra_args)
        await self.engine.start()

    def _rid(self, kind: str, rate: float, i: int) -> str:
        self._seq += 1  # request ids stay unique across points on one engine
        return f"{self.mode}-{rate:g}-{kind}{i}-{self._seq}"

    def _warmup_rows(self, n: int) -> list[DatasetRow]:
        """Same group prefixes, fresh suffixes: warm-ups must not pre-cache measured suffixes."""
        rng = np.random.default_rng(10_007)
        lo, hi = self.token_range
        out = []
        for i in range(n):
            base = self.rows[i % len(self.rows)]
            keep = len(self.prefixes.get(base.group, []))
            suffix = rng.integers(lo, hi, size=len(base.prompt_token_ids) - keep).tolist()
            out.append(DatasetRow(f"warmup{i}", base.prompt_token_ids[:keep] + suffix, base.output_len, base.group))
        return out

    async def run_point(self, rate: float) -> PointResult:
        try:
            return await self._run_point(rate)
        except Exception as e:  # the engine died or refused: the point is a failed row, the sweep goes on
            cause = f"{type(e).__name__}: {e}"
            meta = {"status": "failed", "error": cause, "traceback": traceback.format_exc(limit=5)}
            return PointResult(self.mode, rate, typed_requests(pd.DataFrame()), typed_iterations(pd.DataFrame()), meta)

    async def _run_point(self, rate: float) -> PointResult:
        sw, eng = self.cfg.sweep, self.engine
        n = sw.requests_for(rate)
        rows = [self.rows[i % len(self.rows)] for i in range(n)]
        offsets = arrivals.schedule(n, rate, self.cfg.arrivals.process, self.cfg.arrivals.burstiness,
                                    self.cfg.arrivals.seed)
        started_at = time.time()
        await eng.reset_prefix_cache()
        settle_heap()

        warm_groups: set[int] = set()
        if sw.prime_prefixes:
            for g, prefix in sorted(self.prefixes.items()):
                if prefix:
                    await eng.generate(prefix, 1, self._rid("prime", rate, g), RequestTrace(time.monotonic()))
                    warm_groups.add(g)
        records: list[RequestRecord] = []
        tw = time.monotonic()
        for i, row in enumerate(self._warmup_rows(sw.warmup_requests)):
            rid = self._rid("warmup", rate, i)
            tr = await self._one(row, rid, time.monotonic())
            records.append(make_record(self.mode, rate, i, rid, row, True, float("nan"), tw, tr))
            warm_groups.add(row.group)
        warmup_s = time.monotonic() - tw

        eng.sink.take()
        eng.sink.active = True
        t0 = time.monotonic()
        tasks: list[asyncio.Task] = []
        ids = [self._rid("m", rate, i) for i in range(n)]
        deadline = t0 + sw.max_point_duration_s
        for i, (row, off) in enumerate(zip(rows, offsets)):
            target = t0 + off
            if target > deadline:
                break
            await _sleep_until(target)
            tasks.append(asyncio.create_task(self._one(row, ids[i], time.monotonic())))
            if self.progress:
                tasks[-1].add_done_callback(lambda _: self.progress(1))
        sent = len(tasks)
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=max(0.0, deadline - time.monotonic()))
            for t in pending:
                t.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        duration_s = time.monotonic() - t0
        eng.sink.active = False
        block = eng.block_size or 16
        exp = expected_cached(rows, self.prefixes, block, warm_groups) if self.mode == "on" else [0] * n
        for i, t in enumerate(tasks):
            records.append(make_record(self.mode, rate, i, ids[i], rows[i], False, float(offsets[i]), t0,
                                       t.result(), exp[i]))
        # Requests the deadline stopped before they were sent are still rows: never dropped.
        for i in range(sent, n):
            tr = RequestTrace(float("nan"), error="unfinished: not sent before max_point_duration_s")
            records.append(make_record(self.mode, rate, i, ids[i], rows[i], False, float(offsets[i]), t0, tr, exp[i]))
        dead = eng.is_dead()
        meta = {
            "status": "failed" if dead else "ok",
            "error": "engine died during the point" if dead else "",
            "n_sent": n,
            "started_at": started_at,
            "duration_s": duration_s,
            "warmup_s": warmup_s,
            "block_size": block,
            "engine_startup_s": eng.startup_s,
        }
        req = typed_requests(pd.DataFrame([asdict(r) for r in records]))
        it = iteration_frame(self.mode, rate, eng.sink.take(), t0)
        return PointResult(self.mode, rate, req, it, meta)

    async def _one(self, row: DatasetRow, rid: str, sent: float) -> RequestTrace:
        tr = RequestTrace(sent)
        try:
            await asyncio.wait_for(self.engine.generate(row.prompt_token_ids, row.output_len, rid, tr),
                                   timeout=self.cfg.sweep.request_timeout_s)
        except asyncio.TimeoutError:
            tr.error = f"unfinished: request_timeout_s ({self.cfg.sweep.request_timeout_s:g} s) passed"
        except asyncio.CancelledError:
            tr.error = "unfinished: cancelled at max_point_duration_s"
        except Exception as e:
            tr.error = f"{type(e).__name__}: {e}".strip()[:500]
        return tr


def settle_heap() -> None:
    """Collect, then freeze what is left, before a point is measured.  torch and vLLM leave ~0.7 M
    objects in this process; one full collection over them took 414 ms on the 2-core machine, and on
    2 x H200 the sending loop (and vLLM's output handling beside it) stalled 400-500 ms wherever one
    fell inside a busy point.  Frozen objects are never scanned again; unfreezing first lets the
    previous point's garbage go.  `vllm bench serve` and vLLM's engine core freeze their heaps too."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()


async def _sleep_until(target: float) -> None:
    """asyncio's timer rounds to ~1 ms and a long sleep can overshoot by a few (seen on a 2-core VM at
    1 req/s), so wake early and yield the last stretch.  Long gaps get a wider margin; short ones a
    narrow one, so spinning never takes much of a busy loop's time."""
    delay = target - time.monotonic()
    margin = 0.005 if delay > 0.05 else 0.0015
    if delay > margin:
        await asyncio.sleep(delay - margin)
    while time.monotonic() < target:
        await asyncio.sleep(0)
