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
    popularity: Literal["uniform", "zipf"] = Field("uniform", description="How often each group is asked for: "
                                                   "equally, or Zipf (group g's weight (g+1)^-zipf_exponent).")
    zipf_exponent: float = Field(1.0, gt=0, description="`zipf`: the exponent s of the weights (g+1)^-s.")
    order: Literal["round_robin", "random", "bursty"] = Field(
        "round_robin", description="The order of groups: smooth weighted round robin, independent draws, or "
        "runs of one group (`bursty`).")
    burst_mean: float = Field(4.0, ge=1, description="`bursty`: the mean run length, in requests of one group.")
    prefix_len: Length | None = Field(None, description="Each group's prefix length in tokens, a number or a "
                                      "distribution (drawn per group); None: `dataset.prefix_len`.")
    suffix_len: Length | None = Field(None, description="Unique tokens per request, a number or a distribution; "
                                      "None: `dataset.suffix_len`.")
    output_len: Length | None = Field(None, description="Generated tokens per request, a number or a "
                                      "distribution; None: `dataset.output_len`.")


class SessionsConfig(BaseModel):
    """``dataset.sessions``.  ``output_len`` left out is ``dataset.output_len``."""

    model_config = ConfigDict(extra="forbid")
    turns: Length = Field(3, description="Turns per session, a number or a distribution (drawn per session).")
    user_len: Length = Field(32, description="New user tokens each later turn adds, a number or a distribution.")
    output_len: Length | None = Field(None, description="Generated tokens per turn, a number or a distribution; "
                                      "None: `dataset.output_len`.")
    think_time_s: float = Field(0.0, ge=0, description="Seconds between a turn's last token and the next turn's "
                                "send; 0: at once.")
    think: Literal["fixed", "exponential"] = Field("fixed", description="`fixed`: every gap is `think_time_s`; "
                                                   "`exponential`: drawn with that mean.")


class TraceConfig(BaseModel):
    """``dataset.trace``: how ``dataset.path`` is read and replayed."""

    model_config = ConfigDict(extra="forbid")
    layout: Literal["mooncake", "bailian"] = Field("mooncake", description="The trace's format: Mooncake's "
                                                   "(ms, 512-token blocks) or Qwen-Bailian's (s, 16-token blocks).")
    hash_block_tokens: int | None = Field(None, gt=0, description="Tokens per hash id; None: the layout's.")
    replay: Literal["scaled", "recorded", "drawn"] = Field(
        "scaled", description="`scaled`: recorded gaps scaled to the point's rate; `recorded`: as recorded (the "
        "rate is a label); `drawn`: the study's arrival process, trace order kept.")
    max_requests: int | None = Field(None, gt=0, description="Read only the first N lines; None: all.")
