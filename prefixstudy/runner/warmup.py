"""An engine's warm-up, once after it starts and before its first point: batches of requests sent
at once until its step time settles, rather than a fixed count.  A fresh engine runs its first
points slower (caches, allocators, a start-up's leftover work on the host): measured cold, the
first arm's first point looks slower than the rest of its sweep.

Step time is read the same way for every backend (in process, in a Ray actor, over HTTP): the
median gap between the streamed tokens of a batch, one decode step as the client sees it.  The
engine is warm when the last ``WINDOW`` batches' medians lie within ``tolerance`` of their median
(``settled``).  What the warm-up did goes to the manifest (``engines``)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

import numpy as np

from prefixstudy.engines import RequestTrace

WINDOW = 3  # batches whose medians must agree
# ms of spread always allowed: a server that answers faster than the host's clock and scheduler
# resolve has medians of a few microseconds, which no share of them bounds.
GAP_FLOOR_MS = 0.05


def batch_gap_ms(traces: Sequence[RequestTrace]) -> float:
    """The median gap (ms) between consecutive tokens over a batch's requests that finished; NaN
    without any gap."""
    gaps = [np.diff(t.token_times) for t in traces if not t.error and len(t.token_times) > 1]
    return float(np.median(np.concatenate(gaps)) * 1e3) if gaps else float("nan")


def settled(gaps_ms: Sequence[float], tolerance: float, window: int = WINDOW) -> bool:
    """Whether an engine whose successive warm-up batches had these median token gaps is warm: the
    last ``window`` of them lie within ``tolerance`` (a share) of their median, plus
    ``GAP_FLOOR_MS``.  Fewer batches, or a batch without a gap, is not warm."""
    last = list(gaps_ms[-window:])
    if len(last) < window or not all(math.isfinite(g) for g in last):
        return False
    return max(last) - min(last) <= tolerance * statistics.median(last) + GAP_FLOOR_MS


def skipped(why: str) -> dict:
    """The manifest's record of a warm-up not run."""
    return {"settled": None, "stopped": f"skipped: {why}", "batches": 0, "requests": 0, "gap_ms": [], "s": 0.0}


def note(mode: str, record: dict) -> str:
    """The console note (one line, at most 120 characters) for a warm-up that ran its batches
    without settling; "" for one that settled, was skipped, or failed (a request failed: the
    points that follow say how, each on its line)."""
    if record.get("settled") is not False or record["stopped"].startswith("failed"):
        return ""
    return (f"warning: cache {mode.upper()}: the engine's step time did not settle in its warm-up "
            f"(still moving after {record['batches']} batches)")[:120]
