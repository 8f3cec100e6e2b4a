"""The config sections of the generated and replayed workloads (``dataset.mix``,
``dataset.sessions``, ``dataset.trace``) and their token lengths, a number or a distribution
(``Length``), apart from the workloads themselves (``prefixstudy.workloads``, which draw them):
the study config names them without importing the workloads.

In YAML: ``suffix_len: 16`` or ``suffix_len: {dist: uniform, low: 8, high: 64}`` (inclusive),
``{dist: normal, mean: 200, std: 50, low: 1}`` (rounded, clipped to [low, high]),
``{dist: lognormal, mean: 200, std: 150, low: 1}`` (mean and std of the lengths themselves), or
``{dist: choice, values: [128, 512], weights: [3, 1]}``."""

from __future__ import annotations

from typing import Literal, Union

from pydantic import BaseModel, ConfigDict, Field, model_validator


class LengthDist(BaseModel):
    model_config = ConfigDict(extra="forbid")
    dist: Literal["uniform", "normal", "lognormal", "choice"] = Field(
        description="The distribution: `uniform` (low..high inclusive), `normal` / `lognormal` (mean, std of the "
        "lengths themselves), `choice` (values, weights).")
    low: int = Field(0, ge=0, description="Smallest length, tokens; every draw is clipped to it.")
    high: int | None = Field(None, ge=0, description="Largest length, tokens (`uniform` needs it); draws are "
                             "clipped to it; None: no upper clip.")
    mean: float | None = Field(None, gt=0, description="`normal` / `lognormal`: the mean length, tokens.")
    std: float | None = Field(None, ge=0, description="`normal` / `lognormal`: the standard deviation, tokens.")
    values: list[int] | None = Field(None, description="`choice`: the lengths to pick from.")
    weights: list[float] | None = Field(None, description="`choice`: one weight per value; None: equal.")

    @model_validator(mode="after")
    def _complete(self) -> "LengthDist":
        need = {"uniform": ("high",), "normal": ("mean", "std"), "lognormal": ("mean", "std"),
                "choice": ("values",)}[self.dist]
        for k in need:
            if getattr(self, k) is None:
                raise ValueError(f"dist {self.dist} needs '{k}'")
        if self.high is not None and self.high < self.low:
            raise ValueError(f"high {self.high} < low {self.low}")
        if self.values is not None and (not self.values or min(self.values) < 0):
            raise ValueError("values must be a non-empty list of lengths >= 0")
        if self.weights is not None and (self.values is None or len(self.weights) != len(self.values)
                                         or min(self.weights) < 0 or sum(self.weights) <= 0):
            raise ValueError("weights must be >= 0, not all 0, one per value")
        return self


Length = Union[int, LengthDist]


Length = Union[int, LengthDist]


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
