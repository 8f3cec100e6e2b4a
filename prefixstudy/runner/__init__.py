"""Stage: runner.  Replays the dataset at one rate against one engine, and records every request.

A ``ModeSession`` (``session``) owns one engine (one mode, any backend, through ``engines.Engine``
only) and runs points on it: reset the prefix cache, prime the group prefixes, send the warm-up
requests, then send the measured requests on the arrival schedule (``plan``).  It hands on a
``PointResult``: typed request rows, iteration rows and the point's metadata (``records``).
Executors (local, Ray) only decide where sessions live, and run them under ``run_until_signal``
(``signals``).
"""

from prefixstudy.runner.pacing import settle_heap
from prefixstudy.runner.plan import point_plan, token_range, warmup_rows
from prefixstudy.runner.records import iteration_frame, itl_summary, make_record, percentile
from prefixstudy.runner.session import ModeSession
from prefixstudy.runner.signals import Terminated, run_until_signal, stop_requested

__all__ = ["ModeSession", "Terminated", "iteration_frame", "itl_summary", "make_record", "percentile",
           "point_plan", "run_until_signal", "settle_heap", "stop_requested", "token_range", "warmup_rows"]
