"""The seed sweep's simulation speed: this checkout against a baseline commit (default bd45018,
the issue's), the issue's own command timed side by side on this machine, interleaved
(baseline, branch, baseline, ...), ``--runs`` each (default 3), medians and their ratio:

    prefixstudy simulate experiments/seed-a100x8-tp8.yaml --calibration experiments/results/h200-tp1 \\
        --gpu A100-SXM4-40GB --tp 8 --jobs 2 --out TMP

Per run: the command's wall seconds (vLLM's import, the fit, the points, the report), the
points' phase (the manifest's ``sim.wall_s``), and the simulation's own seconds (the sum of the
points' ``sim_wall_s``: each point runs in one single-threaded worker, so these are about its CPU
seconds, and move little with other load), as simulated requests per such second.  The load
average is read before and after (other sessions share this machine).  Then the results are
compared: the branch against its own ``--stepwise`` run must be identical (requests.parquet and
iterations.parquet, every column but wall-clock stamps); the baseline's differ where the step
cost changed since, and the differing columns are listed.  One JSON line per invocation is
appended to benchmarks/results/simulate_speed.jsonl.

    git worktree add /tmp/bd45018 bd45018      # once: the baseline's code
    python benchmarks/simulate_speed.py [--baseline /tmp/bd45018] [--runs 3]

``--against-stepwise`` times this checkout against its own ``--stepwise`` path instead, interleaved
(stepwise, branch, stepwise, ...), both with ``--no-report``: the decode lane's share alone, with
the results compared the same way.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
COMMAND = ["simulate", "experiments/seed-a100x8-tp8.yaml", "--calibration", "experiments/results/h200-tp1",
           "--gpu", "A100-SXM4-40GB", "--tp", "8", "--jobs", "2"]
WALL_CLOCK_COLUMNS = ["started_at"]  # host stamps, different in every run
RESULTS = REPO / "benchmarks/results/simulate_speed.jsonl"


def load_avg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def run_once(code: Path, out: Path, extra: list[str] = ()) -> dict:
    """One run of the seed command with ``code`` first on PYTHONPATH (its repository root)."""
    env = {**os.environ, "PYTHONPATH": str(code)}
    before = load_avg()
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "prefixstudy", *COMMAND, "--out", str(out), *extra], cwd=code, env=env,
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall_s = time.perf_counter() - t0
    run_dir = next(out.glob("*/*/manifest.json")).parent
    manifest = json.loads((run_dir / "manifest.json").read_text())
    sim_s = sum(p["sim_wall_s"] for p in manifest["points"])
    n_requests = sum(p["n_sent"] for p in manifest["points"])
    return {"wall_s": round(wall_s, 2), "points_phase_s": round(manifest["sim"]["wall_s"], 2),
            "sim_s": round(sim_s, 2), "requests": n_requests, "requests_per_sim_s": round(n_requests / sim_s, 1),
            "load_before": before, "load_after": load_avg(), "run_dir": str(run_dir)}


def differing_columns(a: Path, b: Path) -> dict[str, list[str]]:
    """Per results table, the columns whose values differ (all of them if the row counts do)."""
    out = {}
    for name in ("requests.parquet", "iterations.parquet"):
        x = pd.read_parquet(a / name).drop(columns=WALL_CLOCK_COLUMNS, errors="ignore")
        y = pd.read_parquet(b / name).drop(columns=WALL_CLOCK_COLUMNS, errors="ignore")
        if x.shape != y.shape:
            out[name] = [f"rows {len(x)} vs {len(y)}"]
            continue
        out[name] = [c for c in x.columns if c not in y or not x[c].equals(y[c])]
    return out


def git(*args: str, cwd: Path = REPO) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout.strip()


def interleaved(arms: dict[str, tuple[Path, list[str]]], n_runs: int, tmp: Path) -> dict[str, list[dict]]:
    """``n_runs`` runs of each arm (name: its code and extra flags), taking turns."""
    runs: dict[str, list[dict]] = {name: [] for name in arms}
    for i in range(n_runs):
        for name, (code, extra) in arms.items():
            r = run_once(code, tmp / f"{name}-{i}", extra)
            runs[name].append(r)
            print(name, i, _shown(r), flush=True)
    return runs


def _shown(r: dict) -> dict:
    return {k: v for k, v in r.items() if k != "run_dir"}


def measured(runs: dict[str, list[dict]], baseline: str, baseline_commit: str, n_runs: int,
             load_start: list[float]) -> dict:
    """The record's common part: where and when, the medians of each arm and the baseline's ratios
    to the branch."""
    med = {name: {k: statistics.median(r[k] for r in rs)
                  for k in ("wall_s", "points_phase_s", "sim_s", "requests_per_sim_s")}
           for name, rs in runs.items()}
    return {
        "measured_at": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%MZ"),
        "machine": f"{platform.node()}: {os.cpu_count()} cores, shared with other sessions",
        "load_avg_start": load_start, "load_avg_end": load_avg(),
        # An uncommitted results file (this benchmark's own earlier line) changes no code.
        "branch_commit": git("rev-parse", "--short", "HEAD")
        + (" (dirty)" if git("status", "--porcelain", "--", ".", ":!benchmarks/results") else ""),
        "baseline_commit": baseline_commit,
        "command": "prefixstudy " + " ".join(COMMAND), "runs_each": n_runs, "medians": med,
        **{f"ratio_{k}": round(med[baseline][f"{k}_s"] / med["branch"][f"{k}_s"], 2)
           for k in ("wall", "points_phase", "sim")},
        "runs": {name: [_shown(r) for r in rs] for name, rs in runs.items()},
    }


def write(record: dict, shown: tuple[str, ...]) -> None:
    print(json.dumps({k: record[k] for k in ("medians", "ratio_wall", "ratio_points_phase", "ratio_sim", *shown)},
                     indent=1))
    with RESULTS.open("a") as f:
        f.write(json.dumps(record) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", type=Path, default=Path("/tmp/bd45018"), help="the baseline's worktree")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--against-stepwise", action="store_true", help="the baseline is this checkout's --stepwise path")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="simulate_speed-"))
    load_start = load_avg()
    if args.against_stepwise:
        runs = interleaved({"stepwise": (REPO, ["--stepwise", "--no-report"]), "branch": (REPO, ["--no-report"])},
                           args.runs, tmp)
        record = measured(runs, "stepwise", "the same checkout, --stepwise", args.runs, load_start)
        record["branch_vs_stepwise_differing"] = differing_columns(Path(runs["branch"][0]["run_dir"]),
                                                                   Path(runs["stepwise"][0]["run_dir"]))
        return write(record, ("branch_vs_stepwise_differing",))
    if not (args.baseline / "prefixstudy").is_dir():
        sys.exit(f"--baseline {args.baseline}: no prefixstudy there (git worktree add {args.baseline} bd45018)")
    runs = interleaved({"baseline": (args.baseline, []), "branch": (REPO, [])}, args.runs, tmp)
    stepwise = run_once(REPO, tmp / "branch-stepwise", ["--stepwise", "--no-report"])
    print("branch --stepwise", _shown(stepwise), flush=True)
    branch_dir, base_dir = Path(runs["branch"][0]["run_dir"]), Path(runs["baseline"][0]["run_dir"])
    record = measured(runs, "baseline", git("rev-parse", "--short", "HEAD", cwd=args.baseline), args.runs, load_start)
    record["stepwise"] = _shown(stepwise)
    record["branch_vs_stepwise_differing"] = differing_columns(branch_dir, Path(stepwise["run_dir"]))
    record["branch_vs_baseline_differing"] = differing_columns(branch_dir, base_dir)
    write(record, ("branch_vs_stepwise_differing", "branch_vs_baseline_differing"))


if __name__ == "__main__":
    main()
