"""Token lengths given as a fixed number or a distribution, for the generated workloads.

In YAML: ``suffix_len: 16`` or ``suffix_len: {dist: uniform, low: 8, high: 64}`` (inclusive),
``{dist: normal, mean: 200, std: 50, low: 1}`` (rounded, clipped to [low, high]),
``{dist: lognormal, mean: 200, std: 150, low: 1}`` (mean and std of the lengths themselves), or
``{dist: choice, values: [128, 512], weights: [3, 1]}``.
"""

from __future__ import annotations

import math
from typing import Literal, Union

import numpy as np
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


def draw(spec: Length, rng: np.random.Generator, n: int) -> np.ndarray:
    """n lengths (int64) from ``spec``."""
    if isinstance(spec, int):
        return np.full(n, spec, dtype=np.int64)
    d = spec
    if d.dist == "uniform":
        out = rng.integers(d.low, d.high + 1, size=n)
    elif d.dist == "normal":
        out = np.rint(rng.normal(d.mean, d.std, size=n))
    elif d.dist == "lognormal":
        # The underlying normal's parameters that give lengths of this mean and std.
        sigma2 = math.log(1 + (d.std / d.mean) ** 2)
        out = np.rint(rng.lognormal(math.log(d.mean) - sigma2 / 2, math.sqrt(sigma2), size=n))
    else:
        p = None if d.weights is None else np.asarray(d.weights) / sum(d.weights)
        out = rng.choice(np.asarray(d.values), size=n, p=p)
    return np.clip(out, d.low, d.high if d.high is not None else None).astype(np.int64)


def lowest(spec: Length) -> int:
    """The smallest length ``spec`` can give."""
    if isinstance(spec, int):
        return spec
    return min(spec.values) if spec.dist == "choice" else spec.low
