"""Keeping a point's sends on time: a settled heap before the point is measured (``settle_heap``),
and a sleep that wakes at its target within the event loop's resolution (``_sleep_until``)."""

from __future__ import annotations

import asyncio
import gc
import time


# The objects a full collection left frozen, the last time settle_heap made one (None: never), and
# the objects each call since has frozen.  Counted as they are frozen: asking the interpreter
# (gc.get_freeze_count) walks every frozen object, 0.105 s over vLLM's 0.66 M, a hundred times the
# collection of a point's own objects (benchmarks/results/settle_heap.jsonl).
_after_full: list[int | None] = [None]
_frozen_since: list[int] = [0]


def settle_heap() -> None:
    """Collect, then freeze what is left, before a point is measured.  torch and vLLM leave ~0.7 M
    objects in this process; one full collection over them took 414 ms on the 2-core machine, and on
    2 x H200 the sending loop (and vLLM's output handling beside it) stalled 400-500 ms wherever one
    fell inside a busy point.  Frozen objects are never scanned again.  `vllm bench serve` and vLLM's
    engine core freeze their heaps too.

    Most calls collect only what was allocated since the last freeze (the last point's garbage and
    survivors): 1 ms after a stand-in point of 40,000 objects, against 627 ms for the first,
    full call with vLLM imported (benchmarks/settle_heap.py on the 2-core machine).  A full collection,
    unfreezing first so that cyclic garbage among the frozen objects goes too, is made on the first
    call and once the calls since have frozen a quarter as many objects as the last full one left:
    the rule CPython's own collector follows for its oldest generation, so frozen garbage stays below
    a quarter of the heap.  Code that unfreezes the heap leaves every object young; the next call
    then walks them all, as a full collection would, and counts them, so the call after it is full."""
    last = _after_full[0]
    if last is None or _frozen_since[0] > last / 4:
        gc.unfreeze()
        gc.collect()
        _after_full[0], _frozen_since[0] = len(gc.get_objects()), 0
    else:
        gc.collect()
        _frozen_since[0] += len(gc.get_objects())  # what this freeze adds: the young generations
    gc.freeze()


# The longest single timer sleep.  A timer overshoots in proportion to its length: 0.1 % on this VM's
# asyncio loop, 0.5 % on the uvloop a Ray actor runs (4.5 s slept 22 ms long; benchmarks/timer_overshoot.py),
# which made the sends after long gaps at 1 req/s on Ray TP 2 late by 2-15 ms.  Napping at most 50 ms
# keeps any overshoot to a fraction of the spin margin below.
MAX_NAP_S = 0.05
SPIN_MARGIN_S = 0.0015


async def _sleep_until(target: float) -> None:
    """Sleep in naps of at most MAX_NAP_S until SPIN_MARGIN_S before target, then yield the last
    stretch: asyncio's timer rounds to ~1 ms.  The spin yields with sleep(0), so the loop's other
    work (vLLM's output handling) runs in it; it never takes much of a busy loop's time."""
    while (delay := target - time.monotonic()) > SPIN_MARGIN_S:
        await asyncio.sleep(min(delay - SPIN_MARGIN_S, MAX_NAP_S))
    while time.monotonic() < target:
        await asyncio.sleep(0)
