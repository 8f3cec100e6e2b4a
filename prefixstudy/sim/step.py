"""Stage: sim.  What one simulated engine step is made of, shared by the per-step driver
(``sim.driver``) and the decode lane (``sim.lane``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

SAMPLED_TOKEN_ID = 0  # any id: outputs are never shared between requests, so never hit the cache


@dataclass(frozen=True)
class StepFeatures:
    """What a step computes: the inputs of the step-cost model (``prefixstudy.sim.cost``)."""

    prefill_tokens: int  # prompt tokens computed this step
    decode_tokens: int  # tokens of requests past their prompt
    context_tokens: int  # KV tokens attended, summed over scheduled requests, after the step
    num_reqs: int  # requests in the batch
    cached_tokens: int = 0  # prompt tokens served from the cache to requests first scheduled now
    num_prefill_reqs: int = 0  # requests computing prompt tokens this step
    prompt_tokens_new: int = 0  # prompt length of the requests first scheduled now


StepCost = Callable[[StepFeatures], float]  # -> step_ms
