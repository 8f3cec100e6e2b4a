"""The SLO search (``sweep.slo``): each arm's highest rate meeting every objective, decided from
the points already recorded, so that a resumed run derives the same state.

Pure: ``objective_values`` turns one point's requests into the objectives' percentiles;
``search_arm`` takes an arm's recorded points and says which points to run next, or why the
search stopped.  A rate meets the objectives when every repeat there was measured, unsaturated
and within every bound; the arm's answer lies between its highest rate that met them (``lo``)
and its lowest rate that did not (``hi``), where latency grows with the rate.

How it walks: the first rate is ``start_rate``; while every rate met the objectives the next is
``growth`` times the highest (up to ``max_rate``); while none did, ``growth`` times lower than the
lowest (down to ``min_rate``); once both exist, the geometric midpoint of ``lo`` and ``hi``
(3 significant digits, so rates read back exactly), until ``hi <= lo * (1 + tolerance)``.  Then
``lo`` gets repeats 1.. ``sweep.repeats - 1``; a repeat that misses makes ``lo`` a failing rate
and the bisection goes on below it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from prefixstudy.config.slo import SloSearchConfig, objective_parts, round_rate
from prefixstudy.metrics.requests import split_outcomes

# Why an arm's search stopped (the manifest, slo.csv's readers, the report).
CONVERGED = "converged"  # the bracket is within tolerance; its upper end missed an objective
SATURATED = "saturated"  # the same, but the upper end saturated: the engine's limit, not the SLO's
MAX_RATE = "max rate"  # met at max_rate: the answer is at least that
MIN_RATE = "min rate"  # missed at min_rate: no rate probed meets the objectives
FAILURES = "failures"  # a point failed (the engine or the server broke): the search cannot go on
MAX_PROBES = "max probes"  # max_probes rates probed: the bracket is the answer
STOP_REASONS = (CONVERGED, SATURATED, MAX_RATE, MIN_RATE, FAILURES, MAX_PROBES)

MET, MISSED = "met", "missed"  # a point's verdict; also SATURATED and "failed"


def objective_values(requests: pd.DataFrame, itl_ms: dict | None, objectives: dict[str, float]) -> dict:
    """Each objective's value (ms) at one point, None where there is none to hold against a bound
    (no request finished).  ttft / tpot / e2e: the percentile over the measured requests, each
    failed or unfinished one counted as over any bound (as numpy's linear percentile of values
    where those are +inf); tpot skips one-token requests (NaN).  itl: the percentile of the
    point's pooled inter-token gaps (``itl_ms``, the point's metadata), None when any measured
    request failed or did not finish (its gaps are unknown)."""
    ok, n_failed, n_unfinished = split_outcomes(requests)
    out: dict[str, float | None] = {}
    for name in objectives:
        metric, q = objective_parts(name)
        if metric == "itl":
            key = f"p{int(q) if int(q) == q else q}"
            v = (itl_ms or {}).get(key)
            out[name] = None if v is None or n_failed or n_unfinished else float(v)
            continue
        v = ok[f"{metric}_ms"].dropna().to_numpy(float)
        big = np.finfo(float).max  # +inf would make numpy's interpolation between two of them NaN
        v = np.concatenate([v, np.full(n_failed + n_unfinished, big)])
        if not len(v):
            out[name] = None
            continue
        p = float(np.percentile(v, q))
        out[name] = None if p > 1e300 else p
    return out


def verdict(point: dict, objectives: dict[str, float]) -> str:
    """One recorded point (a manifest entry: status, saturated, slo_ms): met, missed, saturated or failed."""
    if point.get("status", "ok") != "ok":
        return "failed"
    if point.get("saturated"):
        return SATURATED
    values = point.get("slo_ms") or {}
    for name, bound in objectives.items():
        v = values.get(name)
        if v is None or not v <= bound:
            return MISSED
    return MET


@dataclass
class ArmSearch:
    arm: str
    rates: list[float] = field(default_factory=list)  # rates probed (repeat 0), in the order they ran
    lo: float | None = None  # highest rate where every repeat met the objectives
    hi: float | None = None  # lowest rate where one did not
    hi_verdict: str | None = None  # missed or saturated
    next_points: list[tuple[float, int]] = field(default_factory=list)  # (rate, repeat) to run next
    stopped: str | None = None  # one of STOP_REASONS, None while searching
    repeats_met: int = 0  # repeats at lo that met the objectives

    @property
    def final_rate(self) -> float | None:
        return self.lo if self.stopped else None


def search_arm(arm: str, points: list[dict], spec: SloSearchConfig, repeats: int) -> ArmSearch:
    """What arm ``arm`` runs next, from its recorded points (manifest entries: rate, repeat,
    status, saturated, slo_ms; in the order they ran).  ``spec``: its rates set
    (``SloSearchConfig.resolved``)."""
    s = ArmSearch(arm)
    by_rate: dict[float, list[str]] = {}
    for p in points:
        r = float(p["rate"])
        if int(p.get("repeat", 0)) == 0 and r not in s.rates:
            s.rates.append(r)
        by_rate.setdefault(r, []).append(verdict(p, spec.objectives))
    rate_verdict = {r: ("failed" if "failed" in v else SATURATED if SATURATED in v else MISSED if MISSED in v else MET)
                    for r, v in by_rate.items()}
    bad = sorted(r for r, v in rate_verdict.items() if v in (MISSED, SATURATED))
    s.hi = bad[0] if bad else None
    s.hi_verdict = rate_verdict[s.hi] if bad else None
    met = [r for r, v in rate_verdict.items() if v == MET and (s.hi is None or r < s.hi)]
    s.lo = max(met) if met else None
    if s.lo is not None:
        s.repeats_met = by_rate[s.lo].count(MET)
    if "failed" in rate_verdict.values():
        s.stopped = FAILURES
        return s
    start = spec.start_rate
    nxt: float | None = None
    done = None  # why the bracket is final (the repeats at lo come first)
    if not points:
        nxt = start
    elif s.hi is None:  # every rate met: grow
        if s.lo >= spec.max_rate:
            done = MAX_RATE
        else:
            nxt = min(round_rate(s.lo * spec.growth), spec.max_rate)
    elif s.lo is None:  # none met: shrink
        if s.hi <= spec.min_rate:
            s.stopped = MIN_RATE
            return s
        nxt = max(round_rate(s.hi / spec.growth), spec.min_rate)
    else:
        mid = round_rate(math.sqrt(s.lo * s.hi))
        if s.hi <= s.lo * (1 + spec.tolerance) or not s.lo < mid < s.hi:
            done = SATURATED if s.hi_verdict == SATURATED else CONVERGED
        else:
            nxt = mid
    have = {int(p.get("repeat", 0)) for p in points if float(p["rate"]) == s.lo}
    return next_step(s, done, [(s.lo, k) for k in range(repeats) if k not in have], nxt, spec.max_probes)


def next_step(s, done: str | None, owed: list[tuple[float, int]], nxt: float | None, max_probes: int):
    """A search's (ArmSearch or capacity_search.CapacitySearch) step once it knows whether its
    bracket is final (``done``, why): the repeats it still owes there, and when none, the stop;
    else its next probe ``nxt``, unless it has probed ``max_probes`` rates."""
    if done is not None:
        s.next_points = owed
        if not owed:
            s.stopped = done
        return s
    if len(s.rates) >= max_probes:
        s.stopped = MAX_PROBES
        return s
    s.next_points = [(nxt, 0)]
    return s


def probe_rows(arm: str, points: list[dict], objectives: dict[str, float]) -> list[dict]:
    """slo.csv's rows of one arm: one per recorded point, in the order they ran."""
    rows = []
    for i, p in enumerate(points):
        row = {"arm": arm, "probe": i, "rate_req_s": float(p["rate"]), "repeat": int(p.get("repeat", 0)),
               "verdict": verdict(p, objectives)}
        values = p.get("slo_ms") or {}
        row |= {f"{name}_ms": (math.nan if values.get(name) is None else float(values[name])) for name in objectives}
        row |= {f"{name}_bound_ms": float(b) for name, b in objectives.items()}
        rows.append(row)
    return rows


def arm_record(s: ArmSearch) -> dict:
    """The manifest's record of one arm's search."""
    return {"rates_tried_req_s": s.rates, "lo_req_s": s.lo, "hi_req_s": s.hi, "hi_verdict": s.hi_verdict,
            "final_rate_req_s": s.final_rate, "repeats_met": s.repeats_met, "stopped": s.stopped}


def gain_bracket(arm: dict, baseline: dict) -> tuple[float, float, float]:
    """(ratio, lo, hi) of arm's highest rate meeting the SLO over the baseline's, from two arm
    records: the ratio of the highest rates that met it, and the bounds the brackets allow
    (arm's lo over baseline's hi, arm's hi over baseline's lo).  Not a statistical interval: each
    arm's answer lies in its bracket where latency grows with the rate; an arm stopped at max rate
    has no upper end (inf), and one that met the SLO nowhere gives NaN."""
    a_lo, b_lo = arm.get("lo_req_s"), baseline.get("lo_req_s")
    if a_lo is None or b_lo is None:
        return (math.nan,) * 3
    a_hi = arm.get("hi_req_s") or math.inf
    b_hi = baseline.get("hi_req_s") or math.inf
    return a_lo / b_lo, a_lo / b_hi, a_hi / b_lo
