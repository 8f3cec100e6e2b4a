"""Stage: sim, as a study.  ``simulate`` replays a study config through the simulator and writes
the results layout of a real run (requests.parquet, iterations.parquet, summary.csv, manifest),
so every analysis, figure and report works on it unchanged.

Per mode, one scheduler (one engine); per point, the real runner's protocol in virtual time:
reset the prefix cache, prime each group's prefix, run the warm-ups one by one, then the measured
requests on the same seeded arrival schedule, cut at ``sweep.max_point_duration_s``.
"""

from __future__ import annotations

import gc
import math
import time
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import pandas as pd

from prefixstudy.config import StudyConfig
from prefixstudy.engines.base import RequestTrace
from prefixstudy.errors import UserError
from prefixstudy.costmodel.arch import Arch, load_arch
from prefixstudy.costmodel.step_cost import CostModel
from prefixstudy.sim.driver import SimRequest, Simulator
from prefixstudy.costmodel.step import SimTrace
from prefixstudy.costmodel.roofline import Deployment, num_gpu_blocks
from prefixstudy.sim.vllm_setup import SchedulerSpec, build_scheduler, vllm_config
from prefixstudy.runner import make_record, point_plan, token_range, warmup_rows
from prefixstudy.schema import PointResult, typed_iterations, typed_requests
from prefixstudy.workloads.base import DatasetRow, expected_cached, group_prefixes

EPOCH_S = 1.0  # the virtual clock starts here: the records treat a stamp of 0 as "none"
DEFAULT_BLOCK_SIZE = 16  # vLLM's GPU default; the CPU build's 128 must be asked for explicitly


@dataclass(frozen=True)
class SimTarget:
    """The engine simulated: its hardware and limits, and the cost model priced for it."""

    gpu: str
    tp: int
    num_gpu_blocks: int
    block_size: int
    cost: CostModel
    stepwise: bool = False  # every step through vLLM's scheduler (no decode lane, ``sim.lane``)


def engine_limits(cfg: StudyConfig) -> dict:
    """The scheduler limits a config's engine section sets (defaults: vLLM's, as VllmEngineConfig)."""
    e = cfg.engine
    extra = getattr(e, "extra_args", {}) or {}
    return {"max_num_batched_tokens": getattr(e, "max_num_batched_tokens", 8192),
            "max_num_seqs": getattr(e, "max_num_seqs", 256), "max_model_len": e.max_model_len,
            "enable_chunked_prefill": bool(extra.get("enable_chunked_prefill", True)),
            "num_gpu_blocks_override": extra.get("num_gpu_blocks_override"),
            "gpu_memory_utilization": getattr(e, "gpu_memory_utilization", 0.9),
            "kv_cache_memory_bytes": getattr(e, "kv_cache_memory_bytes", None)}


def block_count(cfg: StudyConfig, arch: Arch, gpu, tp: int, block_size: int) -> int:
    """engine.extra_args.num_gpu_blocks_override, else kv_cache_memory_bytes, else from memory."""
    lim = engine_limits(cfg)
    if lim["num_gpu_blocks_override"] is not None:
        n = lim["num_gpu_blocks_override"]
        if isinstance(n, bool) or not isinstance(n, int) or n < 2:
            raise UserError("field 'engine.extra_args.num_gpu_blocks_override': must be an integer >= 2")
        return n
    if lim["kv_cache_memory_bytes"] is not None:
        return int(lim["kv_cache_memory_bytes"] // (block_size * arch.kv_bytes_per_token(2) / tp))
    n = num_gpu_blocks(Deployment(arch, gpu, tp), lim["gpu_memory_utilization"], block_size)
    if n < 2:
        raise UserError(f"--gpu {gpu.name}: the weights leave no room for a KV cache at TP {tp}")
    return n


def scheduler_spec(cfg: StudyConfig, target: SimTarget, mode: str) -> SchedulerSpec:
    lim = engine_limits(cfg)
    return SchedulerSpec(model_dir=cfg.model, prefix_caching=cfg.arm(mode).prefix_caching, num_gpu_blocks=target.num_gpu_blocks,
                         block_size=target.block_size, max_num_batched_tokens=lim["max_num_batched_tokens"],
                         max_num_seqs=lim["max_num_seqs"], max_model_len=lim["max_model_len"],
                         enable_chunked_prefill=lim["enable_chunked_prefill"], tensor_parallel_size=target.tp,
                         # no cost yet: the timestamp fit (sim.fit_requests) prices a one-step-at-a-time engine
                         async_scheduling=target.cost is not None and target.cost.pipelined)


@dataclass(frozen=True)
class RowFacts:
    """What every point derives from the dataset rows alone: computed once per process, not per
    point (a point's own scheduler is fresh, these are not state)."""

    prefixes: dict[int, list[int]]
    token_range: tuple[int, int]

    @classmethod
    def of(cls, rows: list[DatasetRow]) -> "RowFacts":
        return cls(group_prefixes(rows), token_range(rows))


class SimSession:
    """One mode's simulated engine, many points (the runner's ModeSession, in virtual time)."""

    def __init__(self, cfg: StudyConfig, mode: str, rows: list[DatasetRow], target: SimTarget, vc=None,
                 facts: RowFacts | None = None):
        self.cfg, self.mode, self.rows, self.target = cfg, mode, rows, target
        spec = scheduler_spec(cfg, target, mode)
        sched, hasher = build_scheduler(spec, load_arch(cfg.model), vc)
        self.sim = Simulator(sched, hasher, target.cost, target.stepwise)
        self.sim.clock_s = EPOCH_S
        self.facts = facts or RowFacts.of(rows)
        self.prefixes = self.facts.prefixes
        self._seq = 0

    def restart(self) -> None:
        """Make the next point see what a freshly built session would: the clock back at the
        epoch and request ids from the start (the prefix cache is reset by every point).  The
        blocks' order in the free queue is not the fresh one, which changes no decision: with no
        block cached, vLLM tells free blocks apart by their id alone, and no record holds an id."""
        self.sim.clock_s = EPOCH_S
        self._seq = 0

    def _one_at_a_time(self, kind: str, rate: float, prompts: list[tuple[list[int], int]]) -> list[SimTrace]:
        out = []
        for prompt, n_out in prompts:
            self._seq += 1
            rid = f"{self.mode}-{rate:g}-{kind}-{self._seq}"
            out.append(self.sim.run([SimRequest(rid, prompt, n_out, self.sim.clock_s)], record=False)[rid])
        return out

    def run_point(self, rate: float, repeat: int = 0) -> PointResult:
        """One point; ``repeat`` k draws the arrival schedule with seed + k, as the runner does."""
        started_at, wall0 = time.time(), time.perf_counter()
        sw = self.cfg.sweep
        self.sim.reset_prefix_cache()
        warm_groups = {g for g, p in self.prefixes.items() if p} if sw.prime_prefixes else set()
        self._one_at_a_time("prime", rate, [(self.prefixes[g], 1) for g in sorted(warm_groups)])
        # The runner's own warm-up rows (same prefixes, fresh suffixes) and plan, not re-derived.
        wrows = warmup_rows(self.rows, self.prefixes, sw.warmup_requests, self.facts.token_range)
        tw = self.sim.clock_s
        wtr = self._one_at_a_time("warmup", rate, [(r.prompt_token_ids, r.output_len) for r in wrows])
        warm_groups |= {r.group for r in wrows}
        rows, parents, offsets = point_plan(self.cfg, self.rows, rate, repeat)
        n = len(rows)
        t0 = self.sim.clock_s
        ids = [f"{self.mode}-{rate:g}-m{i}-{self._seq}" for i in range(n)]
        reqs = [SimRequest(ids[i], r.prompt_token_ids, r.output_len, t0 + float(offsets[i])) if parents[i] < 0 else
                SimRequest(ids[i], r.prompt_token_ids, r.output_len, math.nan, ids[parents[i]], r.think_time_s)
                for i, r in enumerate(rows)]
        self.sim.steps = []
        traces = self.sim.run(reqs, deadline_s=t0 + sw.max_point_duration_s)
        exp = expected_cached(rows, self.prefixes, self.target.block_size, warm_groups) \
            if self.cfg.arm(self.mode).prefix_caching \
            else [0] * n
        records = [_record(self.mode, rate, i, f"warmup{i}", r, True, math.nan, tw, t, 0, sw.request_timeout_s)
                   for i, (r, t) in enumerate(zip(wrows, wtr, strict=True))]
        for i in range(n):
            tr = traces[ids[i]]
            row = replace(rows[i], prompt_token_ids=tr.prompt_token_ids) if tr.prompt_token_ids else rows[i]
            sent_s = tr.arrival_s - t0 if math.isfinite(tr.arrival_s) else math.nan  # inf: a turn never released
            records.append(_record(self.mode, rate, i, ids[i], row, False, sent_s, t0, tr, exp[i],
                                   sw.request_timeout_s, t0 + sw.max_point_duration_s, parents[i]))
        meta = {"status": "ok", "error": "", "n_sent": n, "started_at": started_at,
                "duration_s": self.sim.clock_s - t0, "warmup_s": t0 - tw, "block_size": self.target.block_size,
                "engine_startup_s": 0.0, "sim_wall_s": time.perf_counter() - wall0, "sim_steps": len(self.sim.steps),
                "async_scheduling": self.sim.pipelined,  # the engine the calibration ran (costmodel.step_cost.async_recorded)
                "prefix_caching": self.cfg.arm(self.mode).prefix_caching}  # the hit-rate check's, as a measured point's
        # vars, not asdict: the fields are scalars, and asdict deep-copies each one (a second a sweep)
        req = typed_requests(pd.DataFrame([{**vars(r), "repeat": repeat} for r in records]))
        its = _iterations(self.mode, rate, self.sim.steps, t0).assign(repeat=repeat)
        return PointResult(self.mode, rate, req, typed_iterations(its), meta, repeat)


def _record(mode, rate, index, rid, row, warmup, scheduled_s, t0, tr: SimTrace, expected, timeout_s,
            deadline_s: float = math.inf, parent_index: int = -1):
    """The runner's record of one request, from virtual stamps.  Tokens later than the request's
    timeout after its send never reach the real client: they are cut and the request is unfinished.
    A request due after the point's deadline is never sent, as in the runner."""
    if tr.arrival_s > deadline_s:
        rt = RequestTrace(math.nan, error="unfinished: not sent before max_point_duration_s")
        return make_record(mode, rate, index, rid, row, warmup, scheduled_s, t0, rt, expected,
                           parent_index=parent_index)
    times = [t for t in tr.token_times if t - tr.arrival_s <= timeout_s]
    rt = RequestTrace(tr.arrival_s, times, tr.num_cached_tokens, tr.arrival_s, tr.scheduled_s,
                      times[0] if times else math.nan, times[-1] if times else math.nan)
    if len(times) < len(tr.token_times):
        rt.error = f"unfinished: request_timeout_s ({timeout_s:g} s) passed"
    elif len(times) < row.output_len:
        rt.error = "unfinished: cancelled at max_point_duration_s"
    return make_record(mode, rate, index, rid, row, warmup, scheduled_s, t0, rt, expected, parent_index=parent_index)


def _iterations(mode: str, rate: float, steps: list[dict], t0: float) -> pd.DataFrame:
    df = pd.DataFrame(steps)
    if df.empty:
        return typed_iterations(df)
    df["t_s"] -= t0
    df["step_start_s"] -= t0
    df.insert(0, "mode", mode)
    df.insert(1, "rate", rate)
    return typed_iterations(df)


@contextmanager
def frozen_heap():
    """Python's cyclic collector leaves what is already allocated alone while a simulation runs.
    vLLM's import leaves about 0.8 M objects, and a scheduler allocates one per KV block (122,224
    for the seed's A100): a full collection walks them all, and allocating sets one off again and
    again.  Building the seed's session took 0.40 s with them scanned and 0.07 s frozen
    (docs/simulator.md has the side-by-side gain on the seed's points).  What is frozen is never
    scanned; cyclic garbage among it (a dropped session's free-block queue is a linked cycle) waits
    for the unfreeze on the way out.  ``sessions`` freezes again after vLLM's import and after its
    schedulers are built."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def sessions(cfg: StudyConfig, rows: list[DatasetRow], target: SimTarget) -> list[SimSession]:
    """One session per mode; the VllmConfig is resolved once and shared (it takes seconds).  It
    freezes the heap twice: call it inside ``frozen_heap``, which unfreezes on the way out."""
    lim = engine_limits(cfg)
    spec = scheduler_spec(cfg, target, cfg.sweep.modes[0])
    if lim["max_num_batched_tokens"] < lim["max_model_len"] and not lim["enable_chunked_prefill"]:
        raise UserError("field 'engine.max_num_batched_tokens': below max_model_len needs chunked prefill")
    vc, facts = vllm_config(spec), RowFacts.of(rows)
    gc.freeze()  # vLLM's import, the first time
    built = [SimSession(cfg, m, rows, target, vc, facts) for m in cfg.sweep.modes]
    gc.freeze()  # the schedulers' block objects, which live as long as the sessions
    return built


def model_dir_or_error(cfg: StudyConfig) -> Path:
    d = cfg.model_dir()
    if d is None:
        raise UserError(f"field 'model': the simulator needs a model folder with config.json, got '{cfg.model}'")
    return d
