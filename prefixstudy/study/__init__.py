"""Stage: study.  What runs one study, from its checks to a closed manifest.

``preflight``: what the config asks of its backend and of this machine, before any folder exists.
``orchestrate``: ``run_study``, what ``prefixstudy run`` calls for each cell: plan, check, open
or resume the folder, pick an executor.  ``points``: the loop over the points still to run, and
the sink executors report each point to.  ``slo_rounds``: the SLO search's rounds of points.
``simulate``: the same study run through the simulator, with a fitted step cost.
"""
