"""The step-timing invariants (``metrics.step_checks``) of results folders, in words: the same
lines the report prints, from the folder's iterations.parquet and its step-cost fit.

    python experiments/step_checks.py experiments/results/h200-tp1 [more folders ...]

Exit status 1 if any folder fails a check.
"""

from __future__ import annotations

import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    from prefixstudy.metrics.engine_fit import fit_step_cost
    from prefixstudy.metrics.step_checks import check_steps
    from prefixstudy.report.tables import step_check_lines
    from prefixstudy.results import ITERATIONS, read_table
    from prefixstudy.schema import typed_iterations

    if not argv:
        print("usage: python experiments/step_checks.py RESULTS_FOLDER [...]", file=sys.stderr)
        return 2
    failed = False
    for folder in map(Path, argv):
        if not (folder / ITERATIONS).exists():
            print(f"{folder}: no {ITERATIONS}", file=sys.stderr)
            return 2
        its = typed_iterations(read_table(folder / ITERATIONS))
        fit = fit_step_cost(its, n_boot=0) if len(its) else None
        checks = check_steps(its, fit.coef if fit is not None else None)
        print(f"{folder}:")
        for line in step_check_lines(checks):
            print(f"  {line}")
        failed |= bool(checks) and checks["ok"] is False
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
