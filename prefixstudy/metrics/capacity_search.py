"""The capacity search (``sweep.capacity_search``): each arm's highest sustained arrival rate,
decided from the points already recorded, so that a resumed run derives the same state.

A point is **sustained** when it ran, did not saturate (metrics.saturation's verdict) and every
measured request succeeded.  A rate's verdict is the majority of its repeats; a tie asks for one
more repeat there.  The arm's capacity lies between its highest sustained rate (``lo``) and its
lowest rate not sustained (``hi``).

How it walks (rates on ``CapacitySearchConfig``'s growth grid while no bracket exists): the first
rate is ``start_rate``; while every rate is sustained the next grid rate up (to ``max_rate``);
while none is, the next one down (to ``min_rate``).

Once both exist, the arm's **ceiling** points at the edge: the most completions per second of an
overloaded point whose every request succeeded.  The rates half the tolerance apart around it
(``CapacitySearchConfig.near_ceiling``) are probed first, nearest first, while one lies inside
the bracket and the ceiling is above its sustained end.  An engine that completes about its
capacity when overloaded is bracketed in two probes.  Then geometric midpoints (3 significant
digits), until the bracket's ends, as actual arrival rates, are at most ``1 + tolerance`` apart.

Each end runs ``confirm_repeats`` repeats: a repeat that flips the majority moves that end and the
search goes on.  Offered ends within half the tolerance whose arrivals are wider apart run more
repeats, up to ``max_end_repeats``: a closer rate would not narrow what the windows' Poisson
counts set.

The bracket's ends are actual arrival rates: the highest arrival rate of a window judged sustained
at the lower end, the lowest of a window judged not sustained at the upper end.  Each window's
verdict is about its own arrivals, so both are evidence on the capacity.  Where they cross (a
window sustained faster arrivals than one that was not), the verdicts contradict one capacity at
that resolution: the ends fall back to the mean arrivals of the agreeing repeats, and the
crossing is named.

Pure: ``search_arm`` takes an arm's recorded points (manifest entries with their summary.csv
columns) and says which points to run next, or why it stopped; ``capacity_rows`` turns the
searches into capacity.csv's rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from prefixstudy.config.capacity_search import CapacitySearchConfig
from prefixstudy.metrics.slo_search import (CONVERGED, FAILURES, MAX_PROBES, MAX_RATE, MIN_RATE, gain_bracket, next_step,
                                            round_rate)
from prefixstudy.schema import point_key

CAPACITY_CSV = "capacity.csv"  # one row per arm (COLUMNS), in the run folder
RESOLUTION = "resolution"  # the offered ends are adjacent, or within half the tolerance, yet arrivals are wider apart
STOP_REASONS = (CONVERGED, MAX_RATE, MIN_RATE, FAILURES, MAX_PROBES, RESOLUTION)

SUSTAINED, SATURATED, ERRORS, FAILED = "sustained", "saturated", "errors", "failed"  # a point's verdict
TIE = "tie"  # a rate whose repeats split evenly

COLUMNS = ["mode", "sustained_req_s", "saturated_req_s", "ceiling_req_s", "bracket_width", "stopped",
           "sustained_rate_req_s", "saturated_rate_req_s", "sustained_repeats", "sustained_votes", "saturated_repeats",
           "saturated_votes", "saturated_reasons", "probes", "points", "contradictions", "ratio_vs_baseline",
           "ratio_lo", "ratio_hi", "baseline"]


def verdict(point: dict) -> str:
    """One recorded point (manifest entry and summary row: status, saturated, n_failed, n_unfinished)."""
    if point.get("status", "ok") != "ok":
        return FAILED
    if point.get("saturated"):
        return SATURATED
    if int(point.get("n_failed") or 0) + int(point.get("n_unfinished") or 0):
        return ERRORS
    return SUSTAINED


def _reason(point: dict) -> str:
    if verdict(point) == ERRORS:
        return f"{int(point.get('n_failed') or 0)} failed, {int(point.get('n_unfinished') or 0)} unfinished requests"
    return str(point.get("saturation_reason") or "")


def _num(x) -> float:
    try:
        return float(x)
    except (TypeError, ValueError):
        return math.nan


@dataclass
class CapacitySearch:
    arm: str
    rates: list[float] = field(default_factory=list)  # rates probed (repeat 0), in the order they ran
    points: dict[float, list[dict]] = field(default_factory=dict)  # each rate's points, in the order they ran
    lo: float | None = None  # highest rate judged sustained, below hi
    hi: float | None = None  # lowest rate judged not sustained
    next_points: list[tuple[float, int]] = field(default_factory=list)  # (rate, repeat) to run next
    stopped: str | None = None  # one of STOP_REASONS, None while searching
    contradictions: list[str] = field(default_factory=list)  # rates judged sustained above hi

    def rate_verdict(self, rate: float) -> str:
        votes = [verdict(p) == SUSTAINED for p in self.points[rate]]
        up, down = sum(votes), len(votes) - sum(votes)
        return SUSTAINED if up > down else TIE if up == down else SATURATED

    def agreeing_arrivals(self, end: str) -> list[float]:
        """The actual arrival rates of the repeats at the bracket's end (``lo`` or ``hi``) that agree
        with its verdict (the offered rate where a repeat has no arrival rate)."""
        rate = self.lo if end == "lo" else self.hi
        if rate is None:
            return []
        agree = [p for p in self.points[rate] if (verdict(p) == SUSTAINED) == (end == "lo")]
        return [v if math.isfinite(v := _num(p.get("arrival_rate"))) else rate for p in agree]

    def crossed(self) -> bool:
        """A window at the lower end sustained arrivals at least as fast as a window at the upper end did not."""
        lo, hi = self.agreeing_arrivals("lo"), self.agreeing_arrivals("hi")
        return bool(lo and hi) and max(lo) >= min(hi)

    def arrival(self, end: str) -> float:
        """The bracket's end as an actual arrival rate: the fastest sustained window at the lower
        end, the slowest unsustained window at the upper end; the agreeing repeats' mean where the
        two cross."""
        vals = self.agreeing_arrivals(end)
        if not vals:
            return math.nan
        if self.crossed():
            return sum(vals) / len(vals)
        return max(vals) if end == "lo" else min(vals)

    def width(self) -> float:
        return self.arrival("hi") / self.arrival("lo") if self.lo is not None and self.hi is not None else math.nan

    def ceiling(self, whole: bool = False) -> float:
        """The most completions per second of a saturated point (summary's achieved_rate); NaN before
        one.  ``whole``: only points whose every request succeeded, so that no work was lost to
        requests that timed out in service."""
        over = [_num(p.get("achieved_rate")) for pts in self.points.values() for p in pts if verdict(p) == SATURATED
                and not (whole and int(p.get("n_failed") or 0) + int(p.get("n_unfinished") or 0))]
        return max((v for v in over if math.isfinite(v)), default=math.nan)

    def line(self) -> str:
        """This arm's state in a few words (the console's line per round)."""
        lo, hi = (f"{r:.3g}" if r is not None else "?" for r in (self.lo, self.hi))
        state = self.stopped or ("confirming" if self.next_points and self.next_points[0][1] else
                                 f"next {self.next_points[0][0]:.3g}" if self.next_points else "")
        return f"{self.arm.upper()} [{lo}, {hi}) req/s {state}"


def search_arm(arm: str, points: list[dict], spec: CapacitySearchConfig) -> CapacitySearch:
    """What arm ``arm`` runs next, from its recorded points (manifest entries with their summary
    columns: rate, repeat, status, saturated, n_failed, n_unfinished, arrival_rate; in the order
    they ran)."""
    s = CapacitySearch(arm)
    for p in points:
        r = float(p["rate"])
        if int(p.get("repeat", 0)) == 0 and r not in s.rates:
            s.rates.append(r)
        s.points.setdefault(r, []).append(p)
    if any(verdict(p) == FAILED for p in points):
        s.stopped = FAILURES
        return s
    votes = {r: s.rate_verdict(r) for r in s.points}
    up = sorted(r for r, v in votes.items() if v == SATURATED)
    s.hi = up[0] if up else None
    below = [r for r, v in votes.items() if v == SUSTAINED and (s.hi is None or r < s.hi)]
    s.lo = max(below) if below else None
    s.contradictions = [f"{r:g} sustained above {s.hi:g}" for r, v in sorted(votes.items())
                        if v == SUSTAINED and s.hi is not None and r > s.hi]
    if s.lo is not None and s.hi is not None and s.crossed():
        s.contradictions.append(f"a window at {s.lo:g} sustained {max(s.agreeing_arrivals('lo')):.3g} req/s, one at "
                                f"{s.hi:g} did not sustain {min(s.agreeing_arrivals('hi')):.3g}")
    ties = sorted(r for r, v in votes.items() if v == TIE)
    if ties:  # one more repeat decides
        s.next_points = [(r, _next_repeat(s, r)) for r in ties]
        return s
    nxt, done = None, None
    if not points:
        nxt = spec.start_rate
    elif s.hi is None:  # every rate sustained: grow
        done = MAX_RATE if s.lo >= spec.max_rate else None
        nxt = None if done else spec.grid_above(s.lo)
    elif s.lo is None:  # none sustained: shrink
        done = MIN_RATE if s.hi <= spec.min_rate else None
        nxt = None if done else spec.grid_below(s.hi)
    else:
        mid = round_rate(math.sqrt(s.lo * s.hi))
        if s.width() <= 1 + spec.tolerance:
            done = CONVERGED
        elif not s.lo < mid < s.hi or s.hi / s.lo <= math.sqrt(1 + spec.tolerance):
            # Offered rates within half the tolerance yet arrivals wider apart: the arrivals' own
            # noise, which a closer pair of rates would not narrow.
            done = RESOLUTION
        else:
            # only overloaded points that lost no work to timed-out requests point at the edge; a
            # ceiling under a sustained rate does not either, and one above the bracket walks down to it
            c = s.ceiling(whole=True)
            near = [r for r in spec.near_ceiling(c) if s.lo < r < s.hi and r not in s.points] if c > s.lo else []
            nxt = near[0] if near else mid
    # a final bracket's ends are each confirmed by their repeats before the search stops; ends too
    # close to bisect but with arrivals too far apart run more repeats
    need = spec.max_end_repeats if done == RESOLUTION else spec.confirm_repeats
    owed = [(r, _next_repeat(s, r)) for r in (s.lo, s.hi) if r is not None and len(s.points[r]) < need]
    return next_step(s, done, owed, nxt, spec.max_probes)


def search_arms(points: list[dict], rows: dict[tuple, dict], spec: CapacitySearchConfig,
                modes: list[str]) -> dict[str, CapacitySearch]:
    """Each arm's search from the run's recorded points (manifest entries, in the order they ran)
    and their summary rows (by ``schema.point_key``); the manifest entry wins where both say."""
    merged = [{**rows.get(point_key(p), {}), **p} for p in points]
    return {m: search_arm(m, [p for p in merged if p["mode"] == m], spec) for m in modes}


def manifest_record(spec: CapacitySearchConfig, found: dict[str, CapacitySearch]) -> dict:
    """The manifest's ``capacity_search``: the search's settings and each arm's state."""
    return {**spec.model_dump(), "arms": {m: arm_record(s) for m, s in found.items()}}


def _next_repeat(s: CapacitySearch, rate: float) -> int:
    return max(int(p.get("repeat", 0)) for p in s.points[rate]) + 1


def arm_record(s: CapacitySearch) -> dict:
    """The manifest's record of one arm's search."""
    return {"rates_tried_req_s": s.rates, "lo_rate_req_s": s.lo, "hi_rate_req_s": s.hi,
            "next_points": [[r, k] for r, k in s.next_points], "stopped": s.stopped,
            "contradictions": s.contradictions}


def ratio_bracket(arm: dict, baseline: dict) -> tuple[float, float, float]:
    """(point, lo, hi) of an arm's capacity over the baseline's, from two capacity.csv rows: the
    bounds the brackets allow (``slo_search.gain_bracket``: arm's sustained over baseline's
    saturated, and the reverse) and the ratio of the brackets' geometric means (NaN where an end is
    missing).  Not a statistical interval: each capacity lies in its bracket where the verdict flips
    once along the rate."""
    ends = [{"lo_req_s": _end(r["sustained_req_s"]), "hi_req_s": _end(r["saturated_req_s"])} for r in (arm, baseline)]
    _, lo, hi = gain_bracket(*ends)
    a, b = ([e["lo_req_s"], e["hi_req_s"]] for e in ends)
    point = math.sqrt(a[0] * a[1] / (b[0] * b[1])) if None not in (*a, *b) else math.nan
    return point, lo, hi


def _end(x) -> float | None:
    v = _num(x)
    return v if math.isfinite(v) else None


def capacity_rows(found: dict[str, CapacitySearch], baseline: str | None) -> list[dict]:
    """capacity.csv: one row per arm (``COLUMNS``), from its search.  ``ceiling_req_s``: the most
    completions per second (summary's achieved_rate) of any of the arm's saturated points, what the
    engine delivered while overloaded (below its capacity where requests timed out in service and
    their work was lost).  Verdicts that contradict one capacity (a rate
    sustained above one that was not) are named in ``contradictions``, never dropped."""
    rows = []
    for mode, s in found.items():
        lo, hi = s.arrival("lo"), s.arrival("hi")
        lo_pts, hi_pts = (s.points.get(r, []) if r is not None else [] for r in (s.lo, s.hi))
        reasons = dict.fromkeys(_reason(p) for p in hi_pts if verdict(p) != SUSTAINED)
        rows.append({"mode": mode, "sustained_req_s": lo, "saturated_req_s": hi,
                     "ceiling_req_s": s.ceiling(), "bracket_width": hi / lo,
                     "stopped": s.stopped or "", "sustained_rate_req_s": s.lo if s.lo is not None else math.nan,
                     "saturated_rate_req_s": s.hi if s.hi is not None else math.nan,
                     "sustained_repeats": len(lo_pts),
                     "sustained_votes": sum(verdict(p) == SUSTAINED for p in lo_pts),
                     "saturated_repeats": len(hi_pts),
                     "saturated_votes": sum(verdict(p) != SUSTAINED for p in hi_pts),
                     "saturated_reasons": " | ".join(r for r in reasons if r),
                     "probes": len(s.rates), "points": sum(len(v) for v in s.points.values()),
                     "contradictions": "; ".join(s.contradictions),
                     "ratio_vs_baseline": math.nan, "ratio_lo": math.nan, "ratio_hi": math.nan,
                     "baseline": baseline or ""})
    base = next((r for r in rows if r["mode"] == baseline), None)
    for r in rows:
        if base is not None and r is not base:
            r["ratio_vs_baseline"], r["ratio_lo"], r["ratio_hi"] = ratio_bracket(r, base)
    return rows
