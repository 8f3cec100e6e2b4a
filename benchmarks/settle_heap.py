"""What the runner's pre-point heap settle (``runner.pacing.settle_heap``) costs, in a process that
has imported vLLM as the in-process engine's frontend has: the first call (a full collection over
every object), and the calls between points (what the last point allocated), each after a
stand-in point that allocates ``--point-objects`` objects, half of them kept and half cyclic garbage.

    python benchmarks/settle_heap.py [--points 20] [--point-objects 40000]

Appends one JSON line to benchmarks/results/settle_heap.jsonl: the first call's seconds, and the
median and maximum of the others, with how many of them were full collections (the heap grows by
what the stand-in points keep, so every few points one is), and what one ``gc.get_freeze_count()``
takes over the frozen heap at the end.  Not a test: shared machines are noisy.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import subprocess
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks/results/settle_heap.jsonl"


class _Cycle:
    def __init__(self):
        self.self = self


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", type=int, default=20)
    ap.add_argument("--point-objects", type=int, default=40_000)
    args = ap.parse_args()
    import vllm  # noqa: F401 - the heap an in-process run settles: vLLM, torch, pandas, pyarrow
    from vllm.v1.engine.async_llm import AsyncLLM  # noqa: F401

    import pandas  # noqa: F401

    from prefixstudy.runner import pacing

    kept: list = []
    timed: list[tuple[float, bool]] = []
    marks: list[int] = []
    for _ in range(args.points + 1):
        before = pacing._after_full[0]
        t0 = time.perf_counter()
        pacing.settle_heap()
        timed.append((time.perf_counter() - t0, before is None or pacing._after_full[0] != before))
        marks.append(pacing._after_full[0])
        for _ in range(args.point_objects // 2):  # a stand-in point: records kept, cycles dropped
            kept.append([0.0])
            _Cycle()
    # What the settle avoids by counting what it freezes: the interpreter's count walks every frozen object.
    t0 = time.perf_counter()
    gc.get_freeze_count()
    walk_s = time.perf_counter() - t0
    first, rest = timed[0], timed[1:]
    between = [s for s, full in rest if not full]
    record = {
        "measured_at": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%MZ"),
        "machine": f"{platform.node()}: {os.cpu_count()} cores, shared with other sessions",
        "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                                 text=True).stdout.strip(),
        "load_avg": [round(x, 2) for x in os.getloadavg()],
        "points": args.points, "point_objects": args.point_objects,
        "frozen_after_first": marks[0],
        "first_s": round(first[0], 4),
        "between_points": len(rest), "full_between": sum(full for _, full in rest),
        "full_between_s": [round(s, 4) for s, full in rest if full],
        "incremental_median_s": round(statistics.median(between), 4),
        "incremental_max_s": round(max(between), 4),
        "freeze_count_walk_s": round(walk_s, 4),
    }
    gc.unfreeze()
    print(json.dumps(record, indent=1))
    with RESULTS.open("a") as f:
        f.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
