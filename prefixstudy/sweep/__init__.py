"""A study as a grid: engine axes (a KV-cache capacity, a routing policy, any config field) by
point axes (arm x rate x repeat).  ``run_sweep`` runs any grid; one cell of it is an ordinary run
folder (``study.run_study``), and a grid with engine axes is a parent folder of such cells with
one index, ``sweep.json``.

``sweep.axes`` says what each engine axis does to the config, ``results.sweep_folder`` reads and writes
the index, ``sweep.run_sweep`` plans, checks, runs and resumes.
"""
