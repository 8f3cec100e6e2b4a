"""Stage: metrics (pure statistics).  DataFrames in, numbers or DataFrames out.

Reads the columns of ``schema.REQUEST_COLUMNS`` / ``ITERATION_COLUMNS``; writes the rows of
``schema.SUMMARY_COLUMNS`` (summary.csv).  Nothing here touches files, clocks or global random
state: every bootstrap takes a seed.  The report reads summary.csv and quotes these definitions;
it never computes a second version of a summary.csv number.

* ``requests``: which requests count, percentiles, prefix hit rates, SLOs and goodput.
* ``summary``: one summary.csv row per point (mode x rate x repeat).
* ``saturation``: is a point saturated, and why.
* ``engine_fit``: the step-cost fit, the engine prefill share and the decode slowdown.
* ``bootstrap``: block and hierarchical bootstraps.
* ``headline``: headline.csv, one row per rate over repeats; knee; rate at a threshold.
* ``compare``: TTFT gain with an independent bootstrap, and paired differences.

Definitions used everywhere (the report quotes them):

* **Counted request**: ``warmup == False`` and ``error == ""``.
* **Percentile**: ``numpy.percentile`` with linear interpolation (vLLM's choice).
* **Saturated point** (``saturation``): inside the point's arrival window, a sent request left
  unfinished, completions falling behind arrivals, the requests in the engine (running + waiting)
  rising from the first third to the last, or E2E climbing; see that module for the thresholds.
* **Knee** of a mode (``headline.knee``): between the last rate where most repeats kept up and the
  next, in actual arrival rate.
* **Max rate meeting a threshold** (``headline.rate_at_threshold``): where the mode's p90 E2E
  crosses it, interpolated between rates, with an interval from p90's; a saturated rate is over.
* **Engine prefill share** and **decode slowdown** (``engine_fit``): from one step-cost fit over the
  study's engine steps (timed inside the engine core), with block-bootstrap intervals.
* **Intervals** (``bootstrap``, ``headline``): with two or more repeats, Student's t over the
  repeats' own values (``bootstrap.over_repeats``); with one, a moving-block bootstrap of
  consecutive requests or steps; ON and OFF paired.
"""
