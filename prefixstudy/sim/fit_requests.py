"""Stage: sim.  The step cost fitted to a run's request timestamps alone, for a run without step
records (an HTTP server, ``vllm-server``, SGLang): the fit (``costmodel.timestamp_fit``) with vLLM's
scheduler inside it, and the reading of the run's folder.

* ``load_run``: a results folder's requests and summary; ``has_step_records`` and
  ``why_no_step_fit``: whether its steps give a step-record fit instead.
* ``PointSimulator``: the fit's points simulated under a given cost, each on its own arrival
  schedule; ``fit_timestamps`` runs the fit with it.
* ``fit_error_line``: the line ``prefixstudy simulate`` prints about such a fit.

The fitted engine runs one step at a time, whatever the run's engine did: timestamps give one price
per step and no host launch.  Fitting and simulating the runs of vLLM's async engine pipelined, with
no host launch (``host``; ``experiments/sim/timestamps.py --pipelined``), came out further from
held-out points on three of the four studies tried, both ``vllm serve`` runs among them
(docs/simulator.md).
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import replace
from pathlib import Path

import pandas as pd
from tqdm import tqdm

from prefixstudy.config import StudyConfig
from prefixstudy.costmodel.step_cost import CostModel, busy_steps, load_steps
from prefixstudy.costmodel.timestamp_fit import (MAX_EVALS, MAX_REQUESTS, TIMING, check_loads, cost_model, finished,
                                                 first_guess, fit, fit_points)
from prefixstudy.errors import UserError
from prefixstudy.results import read_summary
from prefixstudy.results.migrate import migrate
from prefixstudy.results.store import read_table
from prefixstudy.sim.sessions import SimSession, SimTarget, frozen_heap, sessions

def has_step_records(run_dir: Path) -> bool:
    """Whether a results folder holds busy engine steps a step-record fit can use."""
    path = Path(run_dir) / "iterations.parquet"
    return path.exists() and len(busy_steps(load_steps(run_dir))) > 0


def why_no_step_fit(run_dir: Path) -> str:
    """Why a run's steps give no step-record fit, for the line that says its timestamps are fitted
    instead: no step records at all, or records that do not time a step's own cost (the host stamps
    of vLLM's async scheduling without the GPU timer, a client's gaps)."""
    path = Path(run_dir) / "iterations.parquet"
    steps = load_steps(run_dir) if path.exists() else None
    if steps is None or not len(steps):
        return "has no step records"
    return f"has no step records that time a step's own cost (timing {','.join(sorted(set(steps['timing'])))})"


def load_run(run_dir: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(requests, summary) of a results folder; the summary may be empty."""
    run_dir = Path(run_dir)
    if not (run_dir / "requests.parquet").exists():
        raise UserError(f"--calibration {run_dir}: no requests.parquet there (is it a study's results folder?)")
    summary = read_summary(run_dir / "summary.csv") if (run_dir / "summary.csv").exists() else pd.DataFrame()
    frames, _ = migrate({"requests": read_table(run_dir / "requests.parquet"), "summary": summary}, {})
    return frames["requests"], frames["summary"]


class PointSimulator:
    """The fit's points simulated under a given cost: one session per mode, built once (a
    scheduler allocates every block object), each point on its own arrival schedule."""

    def __init__(self, cfg: StudyConfig, rows, target: SimTarget, points: pd.DataFrame, max_requests: int):
        modes = sorted(set(points["mode"]))
        self.sessions = {s.mode: s for s in sessions(self._cut(cfg, max_requests, modes), rows, target)}
        # Each point's first requests: as many as the run sent there, at most ``max_requests``.
        self.cfgs = {r: self._cut(cfg, min(max_requests, cfg.sweep.requests_for(r)), modes) for r in set(points["rate"])}
        self.points, self.target = points, target

    @staticmethod
    def _cut(cfg: StudyConfig, n: int, modes: list[str]) -> StudyConfig:
        return cfg.model_copy(update={"sweep": cfg.sweep.model_copy(
            update={"num_requests": n, "min_duration_s": 0.0, "modes": modes})})

    def run(self, cost: CostModel) -> pd.DataFrame:
        """Simulated mean TTFT, TPOT and E2E at each point (same columns as ``fit_points``)."""
        out = []
        for p in self.points.itertuples(index=False):
            s: SimSession = self.sessions[p.mode]
            s.target = replace(self.target, cost=cost)
            s.sim.cost_ms = cost
            s.restart()
            s.cfg = self.cfgs[p.rate]
            r = finished(s.run_point(float(p.rate), int(p.repeat)).requests)
            out.append({"mode": p.mode, "rate": p.rate, "repeat": p.repeat, "n": len(r),
                        "ttft_ms": r["ttft_ms"].mean() if len(r) else math.inf,
                        "tpot_ms": r["tpot_ms"].mean() if len(r) else math.inf,
                        "e2e_ms": r["e2e_ms"].mean() if len(r) else math.inf})
        return pd.DataFrame(out)


def fit_timestamps(cfg: StudyConfig, rows, target: SimTarget, req: pd.DataFrame, summary: pd.DataFrame,
                   source: str, max_requests: int = MAX_REQUESTS, max_evals: int = MAX_EVALS,
                   offset: bool = True, host: dict | None = None, bar: bool | None = False) -> CostModel:
    """The step cost fitted to ``req``'s timestamps (``costmodel.timestamp_fit.fit``; ``cfg``, ``rows``:
    the run's config and dataset; ``target``: its engine, any cost), each cost tried simulated by
    vLLM's scheduler (``PointSimulator``).  Its error on the fitted points is in ``fit_error``.
    ``host``: a fixed host part (``CostModel.host``), which makes the simulated engine pipelined;
    ``prefixstudy simulate`` gives none (module docstring).  ``bar``: the simulations counted on
    stderr as they run (None: only on a terminal); a fit takes tens of seconds on a study of a
    dozen points."""
    points = fit_points(req, summary, max_requests)
    check_loads(points, source)
    x0 = first_guess(req, points, max_requests)
    target = replace(target, cost=cost_model(x0, host=host))  # its scheduler: pipelined with a host part
    # A count and a rate, no total: the search stops on its own, mostly well before the backstop, so
    # a bar against max_evals would show an ETA several times too long.  Every simulation is shown
    # (each takes tenths of a second on a real study).
    with frozen_heap(), tqdm(desc="fitting the step cost", unit=" simulations", leave=False, file=sys.stderr,
                             mininterval=0, miniters=1, disable=None if bar is None else not bar,
                             dynamic_ncols=True) as shown:
        sim = PointSimulator(cfg, rows, target, points, max_requests)

        def simulate(cost: CostModel) -> pd.DataFrame:
            run = sim.run(cost)
            shown.update()
            return run

        return fit(req, points, x0, simulate, source, max_requests, max_evals, offset, host)


def fit_error_line(run_dir: Path) -> str:
    """One line on a simulated run's step cost when it was fitted to request timestamps ('' when not)."""
    try:
        cost = json.loads((Path(run_dir) / "cost_model.json").read_text())
    except (OSError, ValueError):
        return ""
    e = cost.get("fit_error") or {}
    if cost.get("timing") != TIMING or not e:
        return ""
    return (f"step cost fitted to {cost.get('source')}'s request timestamps ({e['points']} points, "
            f"{e['simulations']} simulations): mean |error| on them E2E {e['e2e_mean_abs_err']:.1%} "
            f"(worst {e['e2e_max_abs_err']:.1%}), TPOT {e['tpot_mean_abs_err']:.1%}, TTFT {e['ttft_mean_abs_err']:.1%} "
            f"with a client offset of {e['client_offset_ms']:.1f} ms")
