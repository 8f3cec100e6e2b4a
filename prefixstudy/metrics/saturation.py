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
3. **the system filled up**: the number of requests in the engine (running + waiting, over the
   engine's steps) rose from the first third of the window to the last by at least
   ``GROWTH_MIN`` requests and ``GROWTH_REL`` of the first third's mean.  In vLLM v1 overload
   below ``max_num_seqs`` shows as more *running* requests, not as waiting ones.  Without engine
   steps (a server measured over HTTP) the count is the client's: requests sent and not yet
   answered, at each send.  On one H200 at 32 req/s OFF it rose from 50-80 to about 300 either way,
   while the E2E trend (rule 4) fell: the point's first requests met the backlog of the warm-ups;
4. **latency climbed**: mean E2E of the last third of requests (by schedule) is at least
   ``TREND_REL`` x that of the first third.

Requests that failed (an error other than "unfinished": an HTTP error, a broken stream) say the
server refused or broke, not that it fell behind, so they are left out of every rule.  A point
whose measured requests mostly failed (more than ``FAILED_SHARE``) is **failed**, not saturated:
``failed_point`` says why, in one line.

A saturated point's latency depends on how long it ran: it is a lower bound, and a gain
measured there is a bound too.  On 20-second points (the committed H200 studies) rule 3 also
fires on transients: OFF at 12 req/s on one H200 rose from 9 to 15 requests in one repeat of three
(E2E +11 %), while 16 req/s kept up in all three.  So a rate's knee goes by the majority of its
repeats (metrics.headline.knee), and one repeat only makes its gain a bound.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pandas as pd

from prefixstudy.metrics.requests import counted, measured, open_at_end

COMPLETION_MIN = 0.9
MISSING_MIN = 2  # requests: one late request of a short point is not a trend
GROWTH_MIN = 2.0  # requests
GROWTH_REL = 0.5  # of the first third's mean
TREND_REL = 1.5
FAILED_SHARE = 0.5  # of a point's measured requests; more failed: the point failed
KINDS_SHOWN = 3  # distinct errors named in a failed point's line

COLUMNS = ["arrival_rate", "completion_ratio", "in_system_first", "in_system_last", "e2e_first_ms",
           "e2e_last_ms", "n_unfinished_open"]


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


def completion_ratio(requests: pd.DataFrame) -> float:
    """Share of the window's arrivals that completed within the window extended by the early
    latency (see the module docstring)."""
    m = sent(requests)
    sched = m["scheduled_s"].to_numpy(float)
    if sched.size < 3:
        return math.nan
    a0, a1 = np.nanmin(sched), np.nanmax(sched)
    ok = counted(m)
    early = ok[ok["scheduled_s"] <= a0 + (a1 - a0) / 3]["e2e_ms"]
    lag = float(early.max()) / 1e3 if len(early) else 0.0
    done = (ok["sent_s"] + ok["e2e_ms"] / 1e3).to_numpy(float)
    return float(((done >= a0) & (done <= a1 + lag)).sum() / sched.size)


def in_flight(requests: pd.DataFrame, a0: float, a1: float) -> tuple[float, float]:
    """The client's view of rule 3: at each send in [a0, a1], the measured requests sent and not
    yet answered (one still open at the end counts to the end), in the first and last third."""
    m = sent(requests)
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


def saturation(requests: pd.DataFrame, iterations: pd.DataFrame | None = None) -> dict:
    """One point: the measured quantities (``COLUMNS``), ``saturated`` and ``reason`` (in words)."""
    m = sent(requests)
    sched = m["scheduled_s"].to_numpy(float)
    a0, a1 = (np.nanmin(sched), np.nanmax(sched)) if sched.size else (math.nan, math.nan)
    ok = counted(m)
    e_first, e_last = _thirds(ok["scheduled_s"].to_numpy(float), ok["e2e_ms"].to_numpy(float))
    n_first, n_last = in_system(iterations, a0, a1)
    if math.isnan(n_first) and sched.size:  # no engine steps (HTTP): count what the client has in flight
        n_first, n_last = in_flight(requests, a0, a1)
    s = {"arrival_rate": arrival_rate(requests), "completion_ratio": completion_ratio(requests),
         "in_system_first": n_first, "in_system_last": n_last, "e2e_first_ms": e_first, "e2e_last_ms": e_last,
         "n_unfinished_open": int(open_at_end(requests).sum())}
    why = []
    if s["n_unfinished_open"]:
        why.append(f"{s['n_unfinished_open']} unfinished")
    missing = (1 - s["completion_ratio"]) * np.isfinite(sched).sum()
    if s["completion_ratio"] < COMPLETION_MIN and missing >= MISSING_MIN - 1e-9:
        why.append(f"completed {s['completion_ratio']:.0%} of arrivals in the window")
    if n_last - n_first >= max(GROWTH_MIN, GROWTH_REL * n_first):
        why.append(f"in system {n_first:.1f}->{n_last:.1f}")
    if e_last >= TREND_REL * e_first:
        why.append(f"E2E {e_first:.0f}->{e_last:.0f} ms")
    s["saturated"], s["reason"] = bool(why), "; ".join(why)
    return s
