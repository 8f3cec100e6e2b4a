"""The config sections of the generated and replayed workloads (``dataset.mix``,
``dataset.sessions``, ``dataset.trace``), apart from the workloads themselves so that the study
config can name them without importing the workloads."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from prefixstudy.workloads.lengths import Length


class MixConfig(BaseModel):
    """``dataset.mix``: how the ``dataset.groups`` groups are mixed.  A length left out is the
    dataset's own ``prefix_len`` / ``suffix_len`` / ``output_len``."""

    model_config = ConfigDict(extra="forbid")
    popularity: Literal["uniform", "zipf"] = "uniform"
    zipf_exponent: float = Field(1.0, gt=0)
    order: Literal["round_robin", "random", "bursty"] = "round_robin"
    burst_mean: float = Field(4.0, ge=1)  # requests per run of one group (bursty)
    prefix_len: Length | None = None
    suffix_len: Length | None = None
    output_len: Length | None = None


class SessionsConfig(BaseModel):
    """``dataset.sessions``.  ``output_len`` left out is ``dataset.output_len``."""

    model_config = ConfigDict(extra="forbid")
    turns: Length = 3
    user_len: Length = 32
    output_len: Length | None = None
    think_time_s: float = Field(0.0, ge=0)
    think: Literal["fixed", "exponential"] = "fixed"  # exponential: think_time_s is the mean


class TraceConfig(BaseModel):
    """``dataset.trace``: how ``dataset.path`` is read and replayed."""

    model_config = ConfigDict(extra="forbid")
    layout: Literal["mooncake", "bailian"] = "mooncake"
    hash_block_tokens: int | None = Field(None, gt=0)  # None: the layout's (512 / 16)
    # scaled: recorded gaps scaled so the mean rate is the point's rate; recorded: as recorded
    # (every rate replays the same times); drawn: the study's arrival process, trace order kept.
    replay: Literal["scaled", "recorded", "drawn"] = "scaled"
    max_requests: int | None = Field(None, gt=0)  # the first N lines only
