"""Re-derive every committed study with today's code (``prefixstudy report RUN --rederive``'s
``results.rederive``): each point's summary.csv row from its records (saturation included), the
step-cost fit and the engine columns of summary.csv, the step-timing checks and the fit in
manifest.json, headline.csv, and the reports built from them (report.md and plots/ of a study, routing.* of a
routing sweep, capacity.* of a capacity sweep).  Only studies whose request and step records are
committed can be re-derived; the others are left as they are.

    python experiments/resummarize.py [--no-reports] [STUDY ...]

tests/unit/metrics/test_resummarize.py checks that the committed summary.csv files are what
today's code derives.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def runs() -> list[Path]:
    """Run folders with their records committed: studies, the runs of capacity and routing sweeps."""
    from prefixstudy.results.sweep_folder import is_sweep
    from prefixstudy.results.sweep_folder import cell_dirs

    top = [p.parent for p in RESULTS.glob("*/summary.csv") if (p.parent / "requests.parquet").exists()]
    parents = [p for p in RESULTS.glob("*/") if is_sweep(p)] + [p for p in RESULTS.glob("*/*/") if is_sweep(p)]
    cells = [c for p in parents for c in cell_dirs(p) if (c / "requests.parquet").exists()]
    return sorted(top + cells)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("studies", nargs="*", help="folder names under experiments/results (default: all)")
    ap.add_argument("--no-reports", action="store_true", help="only the tables and manifests")
    a = ap.parse_args()

    from prefixstudy.report.build import build_report
    from prefixstudy.report.sweep import sweep_report
    from prefixstudy.results.rederive import rederive

    todo = [r for r in runs() if not a.studies or r.relative_to(RESULTS).parts[0] in a.studies]
    parents = set()
    for run in todo:
        t0 = time.perf_counter()
        changed = rederive(run)
        if run.parent != RESULTS:
            parents.add(run.parent)
        elif not a.no_reports and (run / "report.md").is_file():
            build_report(run)
        print(f"{run.relative_to(RESULTS)}: {time.perf_counter() - t0:.0f} s", flush=True)
        for c in changed.to_dict("records"):
            print(f"  {c['mode']} {c['rate']:g} r{c['repeat']}: saturated {c['saturated_before']} -> "
                  f"{c['saturated']} {c['saturation_reason']}", flush=True)
    if not a.no_reports:
        for parent in sorted(parents):
            sweep_report(parent, cells=False)
            print(f"{parent.relative_to(RESULTS)}: sweep report", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
