"""Is a point saturated?  Whether the engine kept up with the arrivals, judged inside the point's
arrival window (its first to its last scheduled send), where a stationary system looks the same
at the end as at the start.

Only requests that were sent count here: requests the point's cap stopped before their send time
say the cap was shorter than the schedule, not that the engine fell behind.

A point is **saturated** if any of these holds:

1. a measured request that was sent was still open when the point ended (``n_unfinished``);
2. **completions fell behind**: fewer than ``COMPLETION_MIN`` of the window's arrivals (and at
   least ``MISSING_MIN`` fewer) completed within the window extended by the early latency (the
   longest E2E of the first third of requests), i.e. requests did not leave as fast as they came;
3. **the engine ran full**: through at least ``FULL_SHARE`` of the window's last half, the
   requests in the system (sent and not yet answered, on the client's clocks) were at or above
   ``FULL_LEVEL`` of the engine's admission limit (vLLM's ``max_num_seqs``, times the replicas),
   so it had no room left to grow its batch: it served at its capacity, and what came faster
   queued.  Needs the limit (``limit``); a server whose limit is not given goes by rule 5;
4. **requests waited for admission**: in at least ``WAIT_SHARE`` of the engine's steps in the
   window's last half, requests were waiting (``num_waiting`` > 0): the engine could not start
   them, for want of KV blocks or of batch room.  Needs engine steps;
5. **the backlog grew**, a trend test on the requests in the system (``backlog_trend``): its slope
   is at least ``GROWTH_SHARE_MIN`` of the arrival rate and its lower bound above 0.  It decides
   on any window where neither a limit nor engine steps are known (a server over HTTP); where they
   are, on windows of at least ``MIN_TREND_WINDOW_S`` seconds of arrivals, and there its lower
   bound itself must reach ``GROWTH_SHARE_MIN`` of the arrivals.

Why these.  A continuous-batching engine below capacity keeps up by growing its batch: from an
empty start the number in the system climbs to a level that near capacity takes seconds to settle,
and then wanders around it by tens of requests.  Within a 15-second point that climb and wander
look like a trend to any test on the count alone (rule 5's error rates, beside the others', show
it).  Above capacity the same engine runs into its admission limit within the point and requests
wait; at 0.8 of capacity it stays well below its limit.  Rules 3 and 4 look at that, so a
transient cannot fake them.  But a little above capacity the backlog grows by a few percent of
the arrivals, and with hundreds of slots it takes longer than a short window to fill them: only
the trend shows it.  Over a long window the count below capacity levels off and the trend test
stops mistaking the wander for growth, so rule 5 decides there too (``MIN_TREND_WINDOW_S``).
``docs/saturation.md`` has the error rates of each rule by window length
(``benchmarks/saturation_error_rates.py``).  ``backlog_growth_per_s`` and the thirds
(``in_system_first`` ... ``e2e_last_ms``) are reported for the reader wherever they are not the
verdict.

Requests that failed (an error other than "unfinished": an HTTP error, a broken stream) say the
server refused or broke, not that it fell behind, so they are left out of every rule.  A point
whose measured requests mostly failed (more than ``FAILED_SHARE``) is **failed**, not saturated:
``failed_point`` says why, in one line.

A saturated point's latency depends on how long it ran: it is a lower bound, and a gain
measured there is a bound too.  A rate's knee goes by the majority of its repeats
(metrics.headline.knee_bracket), and one saturated repeat only makes its gain a bound.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pandas as pd

from prefixstudy.shared.bootstrap import t_quantile
from prefixstudy.metrics.requests import counted, measured, open_at_end

COMPLETION_MIN = 0.9
MISSING_MIN = 2  # requests: one late request of a short point is not a trend
FULL_LEVEL = 0.8  # of the admission limit: the engine ran full
FULL_SHARE = 0.1  # of the window's last half
WAIT_SHARE = 0.5  # of the engine's steps in the window's last half with requests waiting
BATCHES = 10  # batch means of the backlog trend test (rule 5)
SAMPLES_PER_BATCH = 20  # times the number in system is read per batch, evenly spaced
ALPHA = 0.01  # one-sided: the chance a stationary point's batch means show a trend this steep
GROWTH_SHARE_MIN = 0.03  # of the arrival rate: a smaller growth is no practical backlog
MIN_WINDOW_REQUESTS = 10  # arrivals in the tested window; fewer: no trend verdict
# Seconds of arrivals from which the trend test decides even where the limit or the engine's steps
# are known.  benchmarks/saturation_error_rates.py: on 60-s windows that test (``sure``) flags at most
# 2 % of points at <= 0.8 of capacity, on 30-s windows more (the fill and its wander).  The gate sits
# under 60 s by a 60-s point's Poisson spread, so that such a point is always judged by the trend.
MIN_TREND_WINDOW_S = 55.0
FAILED_SHARE = 0.5  # of a point's measured requests; more failed: the point failed
KINDS_SHOWN = 3  # distinct errors named in a failed point's line

COLUMNS = ["arrival_rate", "completion_ratio", "in_system_first", "in_system_last", "e2e_first_ms",
           "e2e_last_ms", "backlog_growth_per_s", "backlog_growth_lo", "full_share", "waiting_share",
           "n_unfinished_open"]


def _failed(m: pd.DataFrame) -> pd.Series:
    """Measured rows that failed: an error that is not "unfinished" (those are the engine's backlog)."""
    err = m["error"].fillna("").astype(str)
    return (err != "") & ~err.str.startswith("unfinished")


def sent(requests: pd.DataFrame) -> pd.DataFrame:
    """Measured requests that were sent and did not fail: the ones that say whether it kept up."""
    m = measured(requests)
    return m[m["sent_s"].notna() & ~_failed(m)]


def failed_point(requests: pd.DataFrame) -> str:
    """"" when the point's measured requests mostly did not fail; else one line: how many failed,
    and each distinct error once, with its count, most frequent first."""
    m = measured(requests)
    bad = m[_failed(m)]
    if not len(m) or len(bad) <= FAILED_SHARE * len(m):
        return ""
    kinds = Counter(bad["error"].astype(str)).most_common()
    shown = "; ".join(f"{e} ({n}x)" for e, n in kinds[:KINDS_SHOWN])
    more = f"; {len(kinds) - KINDS_SHOWN} more kinds" if len(kinds) > KINDS_SHOWN else ""
    return f"{len(bad)} of {len(m)} requests failed: {shown}{more}"


def arrival_rate(requests: pd.DataFrame) -> float:
    """The rate the engine was actually offered: (n - 1) / (last - first scheduled send) over the
    measured requests sent.  A Poisson draw of 40 arrivals at "1 req/s" can be 0.8."""
    m = measured(requests)  # failed requests were offered too
    s = m[m["sent_s"].notna()]["scheduled_s"].dropna().to_numpy(float)
    span = s.max() - s.min() if s.size > 1 else 0.0
    return (s.size - 1) / span if span > 0 else math.nan


def _thirds(x: np.ndarray, v: np.ndarray, lo: float | None = None, hi: float | None = None) -> tuple[float, float]:
    """Mean of ``v`` where ``x`` is in the first and the last third of [lo, hi] (default: x's range)."""
    if x.size < 3:
        return math.nan, math.nan
    lo = x.min() if lo is None else lo
    hi = x.max() if hi is None else hi
    third = (hi - lo) / 3
    if third <= 0:
        return math.nan, math.nan
    first, last = v[x <= lo + third], v[x >= hi - third]
    return (float(first.mean()) if first.size else math.nan, float(last.mean()) if last.size else math.nan)


def completion_ratio(m: pd.DataFrame) -> float:
    """Share of the window's arrivals that completed within the window extended by the early
    latency (see the module docstring).  ``m``: the point's ``sent`` requests, as for every rule below."""
    sched = m["scheduled_s"].to_numpy(float)
    if sched.size < 3:
        return math.nan
    a0, a1 = np.nanmin(sched), np.nanmax(sched)
    ok = counted(m)
    early = ok[ok["scheduled_s"] <= a0 + (a1 - a0) / 3]["e2e_ms"]
    lag = float(early.max()) / 1e3 if len(early) else 0.0
    done = (ok["sent_s"] + ok["e2e_ms"] / 1e3).to_numpy(float)
    return float(((done >= a0) & (done <= a1 + lag)).sum() / sched.size)


def in_flight(m: pd.DataFrame, a0: float, a1: float) -> tuple[float, float]:
    """The client's view of rule 3: at each send in [a0, a1], the measured requests sent and not
    yet answered (one still open at the end counts to the end), in the first and last third."""
    start = m["sent_s"].to_numpy(float)
    end = start + np.nan_to_num(m["e2e_ms"].to_numpy(float) / 1e3, nan=np.inf)
    t = start[(start >= a0) & (start <= a1)]
    n = ((start[None, :] <= t[:, None]) & (end[None, :] > t[:, None])).sum(axis=1).astype(float)
    return _thirds(t, n, a0, a1)


def in_system(iterations: pd.DataFrame | None, a0: float, a1: float) -> tuple[float, float]:
    """Mean running + waiting over the engine's steps in the first and last third of [a0, a1]."""
    if iterations is None or not len(iterations):
        return math.nan, math.nan
    if "replica" in iterations and iterations["replica"].nunique() > 1:
        # A fleet: the requests in it are the sum over its replicas (a replica with no step in a
        # third had none in it); a mean over interleaved steps would hide one replica's queue.
        parts = np.array([in_system(g.drop(columns="replica"), a0, a1) for _, g in iterations.groupby("replica")])
        return tuple(float(np.nansum(c)) if np.isfinite(c).any() else math.nan for c in parts.T)
    it = iterations[(iterations["t_s"] >= a0) & (iterations["t_s"] <= a1)]
    n = (it["num_running"] + it["num_waiting"]).to_numpy(float)
    return _thirds(it["t_s"].to_numpy(float), n, a0, a1)


def _in_system_at(m: pd.DataFrame, t: np.ndarray) -> np.ndarray:
    """Measured requests sent and not yet answered at each time in ``t`` (open at the end: to the end)."""
    start = np.sort(m["sent_s"].to_numpy(float))
    end = np.sort(m["sent_s"].to_numpy(float) + np.nan_to_num(m["e2e_ms"].to_numpy(float) / 1e3, nan=np.inf))
    return (np.searchsorted(start, t, side="right") - np.searchsorted(end, t, side="right")).astype(float)


def _grid(lo: float, hi: float) -> np.ndarray:
    """``BATCHES`` x ``SAMPLES_PER_BATCH`` evenly spaced times in [lo, hi], at the slots' middles."""
    n = BATCHES * SAMPLES_PER_BATCH
    return lo + (np.arange(n) + 0.5) * (hi - lo) / n


def burn_in_s(m: pd.DataFrame, a0: float, a1: float) -> float:
    """Seconds from the window's start before the number in system is tested: the longest E2E of
    the first third of requests (the time an empty engine takes to fill), at most a third of it."""
    ok = counted(m)
    early = ok[ok["scheduled_s"] <= a0 + (a1 - a0) / 3]["e2e_ms"].to_numpy(float)
    lag = float(early.max()) / 1e3 if early.size else 0.0
    return min(lag, (a1 - a0) / 3)


def backlog_trend(m: pd.DataFrame, a0: float, a1: float) -> tuple[float, float]:
    """(growth, lower): the least-squares slope of the number in system, in requests per second,
    over [a0 + burn-in, a1], and its one-sided (1 - ALPHA) lower bound from the ``BATCHES`` batch
    means (Student's t, BATCHES - 2 degrees of freedom).  NaN where the window holds fewer than
    ``MIN_WINDOW_REQUESTS`` arrivals."""
    if not (math.isfinite(a0) and math.isfinite(a1)) or a1 <= a0:
        return math.nan, math.nan
    lo = a0 + burn_in_s(m, a0, a1)
    sched = m["scheduled_s"].to_numpy(float)
    if ((sched >= lo) & (sched <= a1)).sum() < MIN_WINDOW_REQUESTS:
        return math.nan, math.nan
    t = _grid(lo, a1)
    y = _in_system_at(m, t).reshape(BATCHES, SAMPLES_PER_BATCH).mean(axis=1)
    x = t.reshape(BATCHES, SAMPLES_PER_BATCH).mean(axis=1)
    dx = x - x.mean()
    slope = float((dx * (y - y.mean())).sum() / (dx ** 2).sum())
    resid = y - y.mean() - slope * dx
    se = math.sqrt(float((resid ** 2).sum()) / (BATCHES - 2) / float((dx ** 2).sum()))
    return slope, slope - t_quantile(1 - ALPHA, BATCHES - 2) * se


def trend_grew(growth: float, growth_lo: float, arrival_rate: float, sure: bool = False) -> bool:
    """Rule 5's test on ``backlog_trend``'s output: a steady growth of at least ``GROWTH_SHARE_MIN``
    of the arrivals.  ``sure``: its lower bound, not only its estimate, reaches that share (where
    the limit rules judge too, a level count's wander must not pass for the slow growth sought)."""
    floor = GROWTH_SHARE_MIN * arrival_rate
    return bool(growth_lo >= floor if sure else growth_lo > 0 and growth >= floor)


def _late_half(a0: float, a1: float) -> tuple[float, float]:
    return a0 + (a1 - a0) / 2, a1


def full_share(m: pd.DataFrame, a0: float, a1: float, limit: int | None) -> float:
    """Share of the window's last half during which the requests in the system were at or above
    ``FULL_LEVEL`` x ``limit``; NaN without a limit."""
    if not limit or not (math.isfinite(a0) and math.isfinite(a1)) or a1 <= a0:
        return math.nan
    return float((_in_system_at(m, _grid(*_late_half(a0, a1))) >= FULL_LEVEL * limit).mean())


def waiting_share(iterations: pd.DataFrame | None, a0: float, a1: float) -> float:
    """Share of the engine's steps in the window's last half with requests waiting; NaN without
    steps (or with no step there).  A fleet: steps of any replica."""
    if iterations is None or not len(iterations) or "num_waiting" not in iterations:
        return math.nan
    lo, hi = _late_half(a0, a1)
    it = iterations[(iterations["t_s"] >= lo) & (iterations["t_s"] <= hi)]
    return float((it["num_waiting"].to_numpy(float) > 0).mean()) if len(it) else math.nan


def saturation(requests: pd.DataFrame, iterations: pd.DataFrame | None = None, limit: int | None = None) -> dict:
    """One point: the measured quantities (``COLUMNS``), ``saturated`` and ``reason`` (in words).
    ``limit``: the engine's admission limit (max_num_seqs x replicas); None: not known."""
    m = sent(requests)
    sched = m["scheduled_s"].to_numpy(float)
    a0, a1 = (np.nanmin(sched), np.nanmax(sched)) if sched.size else (math.nan, math.nan)
    ok = counted(m)
    e_first, e_last = _thirds(ok["scheduled_s"].to_numpy(float), ok["e2e_ms"].to_numpy(float))
    n_first, n_last = in_system(iterations, a0, a1)
    if math.isnan(n_first) and sched.size:  # no engine steps (HTTP): count what the client has in flight
        n_first, n_last = in_flight(m, a0, a1)
    growth, growth_lo = backlog_trend(m, a0, a1)
    s = {"arrival_rate": arrival_rate(requests), "completion_ratio": completion_ratio(m),
         "in_system_first": n_first, "in_system_last": n_last, "e2e_first_ms": e_first, "e2e_last_ms": e_last,
         "backlog_growth_per_s": growth, "backlog_growth_lo": growth_lo,
         "full_share": full_share(m, a0, a1, limit), "waiting_share": waiting_share(iterations, a0, a1),
         "n_unfinished_open": int(open_at_end(requests).sum())}
    why = []
    if s["n_unfinished_open"]:
        why.append(f"{s['n_unfinished_open']} unfinished")
    missing = (1 - s["completion_ratio"]) * np.isfinite(sched).sum()
    if s["completion_ratio"] < COMPLETION_MIN and missing >= MISSING_MIN - 1e-9:
        why.append(f"completed {s['completion_ratio']:.0%} of arrivals in the window")
    if s["full_share"] >= FULL_SHARE:
        why.append(f"ran full: {s['full_share']:.0%} of the window's last half at >= {FULL_LEVEL:.0%} of its "
                   f"{limit}-request limit")
    if s["waiting_share"] >= WAIT_SHARE:
        why.append(f"requests waited in {s['waiting_share']:.0%} of the steps of the window's last half")
    blind = not limit and math.isnan(s["waiting_share"])  # nothing but the trend can tell
    if (blind or a1 - a0 >= MIN_TREND_WINDOW_S) and trend_grew(growth, growth_lo, s["arrival_rate"], not blind):
        tail = ("a trend test, weaker than the server's limit: engine.max_num_seqs" if blind
                else f"a trend over {a1 - a0:.0f} s of arrivals")
        why.append(f"backlog grew {growth:.2f} req/s ({growth / s['arrival_rate']:.0%} of arrivals; "
                   f"in system {n_first:.1f}->{n_last:.1f}; {tail})")
    s["saturated"], s["reason"] = bool(why), "; ".join(why)
    return s
