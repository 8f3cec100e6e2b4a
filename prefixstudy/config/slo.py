"""The SLO search's config (``sweep.slo``, ``prefixstudy run --slo``): objectives on a latency
percentile, and how the highest rate meeting them all is searched (metrics.slo_search)."""

from __future__ import annotations

import math
import re

from pydantic import BaseModel, ConfigDict, Field, field_validator

from prefixstudy.errors import UserError

# What an objective may bound: a request column's percentile over the point's measured requests,
# or (itl) the percentile of every inter-token gap of the point, pooled as `vllm bench serve` does.
SLO_METRICS = ("ttft", "tpot", "itl", "e2e")
_OBJECTIVE = re.compile(r"(ttft|tpot|itl|e2e)_p(\d+(?:\.\d+)?)")


def round_rate(x: float) -> float:
    """3 significant digits: a rate that reads back from summary.csv and the manifest exactly."""
    return float(f"{x:.3g}")


def objective_parts(name: str) -> tuple[str, float]:
    """``"e2e_p90"`` -> ``("e2e", 90.0)``; ValueError naming the token otherwise."""
    m = _OBJECTIVE.fullmatch(name)
    if not m:
        raise ValueError(f"'{name}' is not METRIC_pPCT with METRIC one of {', '.join(SLO_METRICS)} "
                         "(e.g. e2e_p90)")
    q = float(m.group(2))
    if not 0 < q <= 100:
        raise ValueError(f"'{name}': the percentile must be in (0, 100], got {m.group(2)}")
    return m.group(1), q


def parse_objectives(text: str) -> dict[str, float]:
    """``"e2e_p90:2000,ttft_p90:500"`` -> ``{"e2e_p90": 2000.0, "ttft_p90": 500.0}`` (ms).  A bad
    token is a UserError naming it (``--slo``'s one line)."""
    out: dict[str, float] = {}
    for token in (t.strip() for t in str(text).split(",")):
        name, sep, value = token.partition(":")
        if not sep:
            name, sep, value = token.partition("=")
        name = name.strip().lower()
        if not sep or not name:
            raise UserError(f"--slo {text}: '{token}' is not METRIC_pPCT:MS (e.g. --slo e2e_p90:2000,ttft_p90:500)")
        try:
            objective_parts(name)
        except ValueError as e:
            raise UserError(f"--slo {text}: {e}") from None
        try:
            ms = float(value.strip().removesuffix("ms"))
        except ValueError:
            raise UserError(f"--slo {text}: '{token}': '{value.strip()}' is not a number of ms") from None
        if not (ms > 0 and math.isfinite(ms)):
            raise UserError(f"--slo {text}: '{token}': the objective must be a finite number of ms > 0")
        if name in out:
            raise UserError(f"--slo {text}: '{name}' given twice")
        out[name] = ms
    return out


class SloSearchConfig(BaseModel):
    """Search each arm's highest rate meeting every objective: grow the rate geometrically from
    ``start_rate`` until a point misses an objective or saturates, bisect the bracket until its
    bounds are within ``tolerance`` of each other, then run ``sweep.repeats`` repeats at the
    highest rate that met them; a rate meets them only if every repeat there does."""

    model_config = ConfigDict(extra="forbid")
    objectives: dict[str, float] = Field(min_length=1, description="Objectives in ms, `METRIC_pPCT: MS`, METRIC "
                                         "one of ttft, tpot, itl, e2e (e.g. `e2e_p90: 2000`); a point meets them "
                                         "when it is not saturated and every percentile is at or below its bound "
                                         "(requests that failed or never finished count as over it).")
    tolerance: float = Field(0.05, gt=0, le=1, description="Bisect until the bracket's upper rate is within this "
                             "share above its lower rate (0.05: 5 %).")
    start_rate: float | None = Field(None, gt=0, allow_inf_nan=False, description="The first rate probed, req/s; "
                                     "None: the lowest of `sweep.rates`.")
    growth: float = Field(2.0, gt=1, allow_inf_nan=False, description="While every probe meets the objectives, "
                          "the next is this many times the highest so far (and below a failing start, this many "
                          "times lower).")
    max_rate: float | None = Field(None, gt=0, allow_inf_nan=False, description="Rates above this are not probed; "
                                   "an arm meeting the objectives here stops with `max rate`; None: the highest of "
                                   "`sweep.rates`.")
    min_rate: float | None = Field(None, gt=0, allow_inf_nan=False, description="Rates below this are not probed; "
                                   "an arm missing the objectives here stops with `min rate`; None: the lowest of "
                                   "`sweep.rates` / 8.")
    max_probes: int = Field(16, ge=2, le=200, description="Rates probed per arm at most (repeats at the final rate "
                            "not counted); then the arm stops with `max probes` and reports its bracket.")

    @field_validator("objectives", mode="before")
    @classmethod
    def _from_text(cls, v):
        return parse_objectives(v) if isinstance(v, str) else v

    @field_validator("objectives")
    @classmethod
    def _objectives(cls, v: dict[str, float]) -> dict[str, float]:
        for name, ms in v.items():
            objective_parts(name)
            if not (ms > 0 and math.isfinite(ms)):
                raise ValueError(f"{name}: the objective must be a finite number of ms > 0, got {ms}")
        return v

    def resolved(self, rates: list[float]) -> "SloSearchConfig":
        """A copy with start_rate, min_rate and max_rate set (from ``rates``, `sweep.rates`, where unset)."""
        finite = [r for r in rates if math.isfinite(r)] or [1.0]
        hi = self.max_rate if self.max_rate is not None else max(finite)
        lo = self.min_rate if self.min_rate is not None else min(finite) / 8
        start = self.start_rate if self.start_rate is not None else min(finite)
        return self.model_copy(update={"max_rate": hi, "min_rate": min(lo, hi), "start_rate": min(max(start, lo), hi)})

    def extent(self, rates: list[float]) -> list[float]:
        """The rates a search may probe at the ends of its range: what datasets and point limits are sized for."""
        r = self.resolved(rates)
        return [r.min_rate, r.start_rate, r.max_rate]
