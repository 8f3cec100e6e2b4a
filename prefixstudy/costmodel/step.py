"""Stage: sim.  What the per-step driver (``sim.driver``) and the decode lane (``sim.lane``)
share: what one simulated step is made of, a request's virtual stamps, and the clock the lane
advances on the driver's behalf."""

from __future__ import annotations

import functools
import math
import operator
from dataclasses import dataclass, field
from typing import Callable, Protocol

SAMPLED_TOKEN_ID = 0  # any id: outputs are never shared between requests, so never hit the cache


@dataclass(frozen=True)
class StepFeatures:
    """What a step computes: the inputs of the step-cost model (``prefixstudy.costmodel.step_cost``)."""

    prefill_tokens: int  # prompt tokens computed this step
    decode_tokens: int  # tokens of requests past their prompt
    context_tokens: int  # KV tokens attended, summed over scheduled requests, after the step
    num_reqs: int  # requests in the batch
    cached_tokens: int = 0  # prompt tokens served from the cache to requests first scheduled now
    num_prefill_reqs: int = 0  # requests computing prompt tokens this step
    prompt_tokens_new: int = 0  # prompt length of the requests first scheduled now
    # KV tokens the cache holds for its requests during the step: blocks in use times the block size,
    # a block shared by several requests (a cached prefix) counted once.  What the GPU reads from
    # memory where context_tokens counts a shared block once per request.
    kv_tokens: int = 0
    # Prompt tokens of the requests first scheduled now that the prefix cache looks up (0 with caching
    # off): the host hashes them into block hashes, work that grows with the prompt, not the GPU.
    prefix_queries: int = 0


StepCost = Callable[[StepFeatures], float]  # -> step_ms

# The knots of a piecewise-linear step cost in a step's GEMM rows (prompt plus decode tokens): each
# segment is a cost term, ``rows_A_B``, the step's rows between A and B.
ROW_KNOTS = (0, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
ROW_TERMS = tuple(f"rows_{a}_{b}" for a, b in zip(ROW_KNOTS[:-1], ROW_KNOTS[1:], strict=True))


@dataclass(frozen=True)
class RowSegment:
    """Term ``rows_A_B``: a step's GEMM rows (prompt plus decode tokens) between A and B."""

    lo: int
    hi: int

    def __call__(self, f) -> int:
        return min(max(f.prefill_tokens + f.decode_tokens - self.lo, 0), self.hi - self.lo)


def prompt_step(f) -> float:
    """Term ``prompt_step``: 1 where the step computes prompt tokens."""
    return 1.0 if f.prefill_tokens > 0 else 0.0


@functools.cache
def term_getter(name: str) -> Callable[[object], float]:
    """How a cost model reads term ``name`` off a step (a ``StepFeatures``, or a row of step records
    with its fields): the field of that name, or a term derived from them, ``rows_A_B``
    (``RowSegment``) or ``prompt_step``.  Each reader pickles, for the simulator's worker processes."""
    if name.startswith("rows_"):
        lo, hi = (int(x) for x in name.removeprefix("rows_").split("_"))
        return RowSegment(lo, hi)
    if name == "prompt_step":
        return prompt_step
    return operator.attrgetter(name)


def launch_ms(cost: StepCost, f: StepFeatures) -> float:
    """How long the host takes, from scheduling a step, to launch it: a step of vLLM's async engine
    starts on the GPU once both the step before it has ended and the host has launched it.  A cost
    model whose host part overlaps the step before (``costmodel.step_cost.CostModel.launch_ms``) says; any other
    folds the host into the step's own price, and the step starts as the one before ends."""
    launch = getattr(cost, "launch_ms", None)
    return float(launch(f)) if launch is not None else 0.0


def kv_tokens(scheduler) -> int:
    """``StepFeatures.kv_tokens`` from a vLLM scheduler: its KV cache's blocks in use (all but the
    free ones and the null block, what the cache's ``usage`` is the share of) times the block size."""
    pool = scheduler.kv_cache_manager.block_pool
    return (pool.num_gpu_blocks - 1 - pool.get_num_free_blocks()) * int(scheduler.block_size)


@dataclass
class SimTrace:
    """One request's virtual stamps (seconds); ``token_times`` has one entry per generated token."""

    arrival_s: float
    scheduled_s: float = math.nan
    token_times: list[float] = field(default_factory=list)
    num_cached_tokens: int = 0
    prompt_token_ids: list[int] | None = None  # as sent (a later turn's carries its history)


class StepClock(Protocol):
    """The driver's virtual clock and step record, as the decode lane advances them for a
    stretch of steps it takes without vLLM's scheduler (``sim.driver.Simulator``)."""

    clock_s: float
    num_steps: int
    steps: list[dict]
    cost_ms: StepCost
    in_flight: object  # async scheduling: the step scheduled whose output is not applied yet, or None

    def step_row(self, start_s: float, step_ms: float, feats: StepFeatures) -> dict: ...
