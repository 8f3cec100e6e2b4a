"""Coverage of headline.csv's interval method (shared.bootstrap.over_repeats) on synthetic
studies with a known answer (metrics.coverage), larger than the unit test's: more studies, and
shapes closer to a loaded point (longer runs, stronger correlation, a larger run effect).  The
hierarchical percentile bootstrap (400 resamples, fewer studies) is measured beside it for comparison.  Writes
benchmarks/interval_coverage.json (committed).

    python benchmarks/interval_coverage.py [--studies 3000]
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from prefixstudy.metrics.coverage import coverage

SHAPES = {"default": {}, "loaded": {"n": 200, "rho": 0.97, "run_sd_ms": 50.0, "within_sd_ms": 60.0},
          "no run effect": {"run_sd_ms": 0.0}}
OUT = Path(__file__).with_suffix(".json")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--studies", type=int, default=3000)
    ap.add_argument("--percentile-studies", type=int, default=200)
    a = ap.parse_args()
    rows = []
    for name, shape in SHAPES.items():
        for repeats in (2, 3, 5):
            t = coverage(repeats, a.studies, seed=100 + repeats, **shape)
            p = coverage(repeats, a.percentile_studies, seed=200 + repeats, method="percentile", n_boot=400, **shape)
            rows.append({"shape": name, **shape, "repeats": repeats, "studies": a.studies, "t_coverage": t,
                         "t_coverage_se": math.sqrt(t * (1 - t) / a.studies),
                         "percentile_studies": a.percentile_studies, "percentile_coverage": p})
            print(f"{name:14s} R={repeats}: t {t:.3f}  percentile {p:.3f}", flush=True)
    OUT.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
