"""The capacity search's config (``sweep.capacity_search``, ``prefixstudy run --capacity``): how each
arm's highest sustained arrival rate is searched (metrics.capacity_search) and how long its points run.

A point's length depends on where it probes.  Rates on the growth grid (``start_rate`` x
``growth``^k, 3 significant digits), probed once while the bracket is found, run
``short_window_s`` of arrivals: far from the edge a short point tells.  Every other point (the
bisection's midpoints, and every repeat that confirms a verdict at the bracket's ends) is next to
the edge and runs ``edge_window_s``, long enough for a backlog to show its trend.
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field, model_validator

from prefixstudy.config.slo import round_rate


class CapacitySearchConfig(BaseModel):
    """Search each arm's highest sustained arrival rate: grow the rate geometrically from
    ``start_rate`` until a point is not sustained (or shrink until one is), bisect at geometric
    midpoints until the bracket is at most ``1 + tolerance`` wide, then confirm both ends with
    ``confirm_repeats`` repeats each; a rate's verdict is its repeats' majority, a tie runs one more."""

    model_config = ConfigDict(extra="forbid")
    start_rate: float = Field(16.0, gt=0, allow_inf_nan=False, description="The first rate probed, req/s.")
    growth: float = Field(2.0, gt=1, le=16, allow_inf_nan=False, description="While every rate is sustained, the "
                          "next is this many times the last (and below an unsustained start, this many times lower): "
                          "the growth grid.")
    tolerance: float = Field(0.10, gt=0, le=1, description="Bisect until the lowest unsustained arrival rate is at "
                             "most this share above the highest sustained one (0.10: a bracket 1.10 wide).")
    min_rate: float = Field(0.5, gt=0, allow_inf_nan=False, description="Rates below this are not probed; an arm "
                            "not sustaining it stops with `min rate`.")
    max_rate: float = Field(512.0, gt=0, allow_inf_nan=False, description="Rates above this are not probed; an arm "
                            "sustaining it stops with `max rate` (its capacity is at least that).  The dataset is "
                            "sized for `max_rate` x `edge_window_s` requests.")
    short_window_s: float = Field(15.0, gt=0, allow_inf_nan=False, description="Seconds of arrivals of a point on "
                                  "the growth grid, probed while the bracket is found (at least `sweep.num_requests` "
                                  "requests).")
    edge_window_s: float = Field(60.0, gt=0, allow_inf_nan=False, description="Seconds of arrivals of every other "
                                 "point: bisection midpoints and the repeats that confirm the bracket's ends (at least "
                                 "`sweep.num_requests` requests).  `sweep.max_point_duration_s` is raised to 1.5x this, and "
                                 "to 1.25x the longest schedule, where it is shorter.")
    confirm_repeats: int = Field(2, ge=1, le=9, description="Repeats at each end of the final bracket; a rate's "
                                 "verdict is its repeats' majority, so a flip re-opens the bisection (a tie runs one "
                                 "more repeat).")
    max_end_repeats: int = Field(4, ge=1, le=15, description="Where the offered ends are within half the tolerance "
                                 "but their windows' arrivals are wider apart, each end runs more repeats, up to this "
                                 "many, before the arm stops with `resolution`.")
    max_probes: int = Field(16, ge=2, le=200, description="Rates probed per arm at most (repeats not counted); then "
                            "the arm stops with `max probes` and reports its bracket.")

    @model_validator(mode="after")
    def _ordered(self) -> "CapacitySearchConfig":
        if not self.min_rate <= self.start_rate <= self.max_rate:
            raise ValueError(f"start_rate {self.start_rate:g} must lie in [min_rate {self.min_rate:g}, "
                             f"max_rate {self.max_rate:g}] req/s")
        if self.max_end_repeats < self.confirm_repeats:
            raise ValueError(f"max_end_repeats {self.max_end_repeats} must be at least confirm_repeats "
                             f"{self.confirm_repeats}")
        if self.short_window_s > self.edge_window_s:
            raise ValueError(f"short_window_s {self.short_window_s:g} must not exceed edge_window_s "
                             f"{self.edge_window_s:g}")
        return self

    def grid_index(self, rate: float) -> int | None:
        """k where ``rate`` is the grid's k-th rate, or its clamp at min_rate / max_rate; None off the grid."""
        k = round(math.log(rate / self.start_rate, self.growth))
        return k if rate in (self.min_rate, self.max_rate) or self._grid(k) == rate else None

    def grid_above(self, rate: float) -> float:
        """The lowest grid rate above ``rate``, at most max_rate."""
        k = math.floor(math.log(rate / self.start_rate, self.growth)) - 1
        while self._grid(k) <= rate:
            k += 1
        return min(self._grid(k), self.max_rate)

    def grid_below(self, rate: float) -> float:
        """The highest grid rate below ``rate``, at least min_rate."""
        k = math.ceil(math.log(rate / self.start_rate, self.growth)) + 1
        while self._grid(k) >= rate:
            k -= 1
        return max(self._grid(k), self.min_rate)

    def near_ceiling(self, ceiling: float) -> list[float]:
        """The rates probed next to a ceiling (an overloaded point's completions per second), nearest
        first: ``ceiling`` x s^(k + 1/2) for k = -1, 0, -2, 1, -3, 2, where s = sqrt(1 + tolerance).
        Neighbours are half the tolerance apart, so a sustained one below a saturated one is a final
        bracket with room for the windows' arrival noise.  Three steps either side (about 13 % at the
        default tolerance) bound the walk where the ceiling is far from the capacity."""
        step = math.sqrt(1 + self.tolerance)
        return [round_rate(ceiling * step ** (k + 0.5)) for k in (-1, 0, -2, 1, -3, 2)]

    def _grid(self, k: int) -> float:
        return round_rate(self.start_rate * self.growth ** k)

    def window_s(self, rate: float, repeat: int | None) -> float:
        """Seconds of arrivals of the point (rate, repeat); ``repeat`` None: the longest any may have."""
        short = repeat == 0 and self.grid_index(rate) is not None
        return self.short_window_s if short else self.edge_window_s

    def extent(self) -> list[float]:
        """The rates a search may probe at the ends of its range: what datasets and point limits are sized for."""
        return [self.min_rate, self.start_rate, self.max_rate]

    def point_cap_s(self) -> float:
        """The least point cap (``sweep.max_point_duration_s``) an edge point leaves room in."""
        return 1.5 * self.edge_window_s
