"""Stage: metrics (pure statistics).  DataFrames in, numbers or DataFrames out.

Reads the columns of ``schema.REQUEST_COLUMNS`` / ``ITERATION_COLUMNS``; writes the rows of
``schema.SUMMARY_COLUMNS`` (summary.csv).  Nothing here touches files, clocks or global random
state: every bootstrap takes a seed.  The report reads summary.csv and quotes these definitions;
it never computes a second version of a summary.csv number.

* ``requests``: which requests count, percentiles, prefix hit rates, SLOs and goodput.
* ``summary``: one summary.csv row per point, saturation (flag and reason), knee and max rates.
* ``compare``: caching gain ON vs OFF with a seeded bootstrap CI, and paired differences.
* ``engine_fit``: the step-time fit and the engine-level prefill share.

Definitions used everywhere (the report quotes them):

* **Counted request**: ``warmup == False`` and ``error == ""``.
* **Percentile**: ``numpy.percentile`` with linear interpolation (vLLM's choice).
* **Saturated point**: achieved rate < ``ACHIEVED_MIN_RATIO`` x the offered rate as
  realized by the schedule (``keep_up_rate``), OR a measured request was left
  unfinished, OR the waiting queue grows through the point: over the arrival window, mean
  ``num_waiting`` of the last third minus that of the first third is at least
  ``QUEUE_GROWTH_MIN`` requests AND at least ``QUEUE_GROWTH_REL`` x the first-third mean.
* **Knee rate** of a mode: the highest offered rate below that mode's first saturated
  rate (every lower rate is unsaturated too).  NaN if the lowest rate is saturated.
* **Max rate meeting a threshold**: the highest offered rate r such that every point
  of that mode at rates <= r is unsaturated and has metric <= threshold.
* **Engine prefill share**: fit ``step_ms = a + b*prompt_tokens + c*generation_tokens``
  by least squares over busy iterations (pooled over both modes: caching changes how
  many prompt tokens are computed, not what one costs); per point the share is
  ``b * sum(prompt_tokens) / sum(step_ms)`` over the same iterations.
"""
