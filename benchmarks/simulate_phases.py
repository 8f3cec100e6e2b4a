"""Where the seed sweep's ``prefixstudy simulate`` command spends its wall time, by phase: the
imports, the calibration's fit and transfer (``make_target``), the fork server's start (its vLLM
import; ``sim.pool.start``), the points (``_simulate``) and the report (the rest).  One run in this
process, the command as ``benchmarks/simulate_speed.py`` times it; one JSON line appended to
benchmarks/results/simulate_phases.jsonl.

    python benchmarks/simulate_phases.py
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

T0 = time.perf_counter()
REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks/results/simulate_phases.jsonl"
sys.path.insert(0, str(REPO / "benchmarks"))
from simulate_speed import COMMAND  # noqa: E402 - the one seed command both benchmarks time


def timed(mod, name: str, spans: dict[str, float]) -> None:
    fn = getattr(mod, name)

    def wrapper(*a, **k):
        t = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            spans[name] = round(time.perf_counter() - t, 2)

    setattr(mod, name, wrapper)


def main() -> None:
    sys.path.insert(0, str(REPO))
    from prefixstudy.cli import entrypoint
    from prefixstudy.sim import pool
    from prefixstudy.study import simulate as run

    imports_s = time.perf_counter() - T0
    spans: dict[str, float] = {}
    timed(run, "make_target", spans)
    timed(pool, "start", spans)
    timed(run, "_simulate", spans)
    out = tempfile.mkdtemp(prefix="simulate_phases-")
    sys.argv = ["prefixstudy", *COMMAND, "--out", out]
    os.chdir(REPO)
    try:
        entrypoint()
    except SystemExit as e:
        if e.code:
            raise
    total = time.perf_counter() - T0
    rest = total - imports_s - sum(spans.values())
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout
    record = {"measured_at": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%MZ"),
              "machine": f"{platform.node()}: {os.cpu_count()} cores", "commit": commit.strip(),
              "load_avg": [round(x, 2) for x in os.getloadavg()], "total_s": round(total, 2),
              "imports_s": round(imports_s, 2), "fit_s": spans.get("make_target"),
              "fork_server_s": spans.get("start"), "points_s": spans.get("_simulate"),
              "report_and_rest_s": round(rest, 2)}
    print(json.dumps(record))
    with RESULTS.open("a") as f:
        f.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
