"""A search inside a run: which points the study runs next, round by round.  Two kinds:
``sweep.slo`` (each arm's highest rate meeting latency objectives, ``metrics.slo_search``) and
``sweep.capacity_search`` (each arm's highest sustained arrival rate, ``metrics.capacity_search``).

Each round every arm still searching gets its next rate (or its repeats) from its search, decided
from the points recorded so far, and the round runs through the study's point loop as a sweep's
points do: same folder, same rows, same point policy, the arms taking turns (their order flips
each round).  The search's state is in its recorded points only, so a resumed run carries on where
it stopped.  Each round also records the search: the manifest's ``slo_search`` and ``slo.csv``, or
its ``capacity_search`` and ``capacity.csv`` (and a line on the console).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd

from tqdm import tqdm

from prefixstudy.metrics import capacity_search as cap
from prefixstudy.metrics.slo_search import arm_record, objective_values, probe_rows, search_arm
from prefixstudy.results.store import atomic_write_csv, write_capacity_search
from prefixstudy.executors.run_plan import RunPlan

if TYPE_CHECKING:
    from prefixstudy.config import StudyConfig
    from prefixstudy.results.writer import ResultsWriter
    from prefixstudy.schema import PointResult

SLO_CSV = "slo.csv"


def searching(cfg: "StudyConfig") -> str | None:
    """The kind of search the run makes (``slo``, ``capacity``), None for a sweep of ``rates``."""
    return "slo" if cfg.sweep.slo is not None else "capacity" if cfg.sweep.capacity_search is not None else None


def add_objective_values(cfg: "StudyConfig", res: "PointResult") -> None:
    """Put the objectives' values of a finished point in its metadata (the manifest's ``slo_ms``),
    where the search, and a resumed run's search, read them."""
    if cfg.sweep.slo is not None:
        res.meta["slo_ms"] = objective_values(res.requests, res.meta.get("itl_ms"), cfg.sweep.slo.objectives)


def searches(cfg: "StudyConfig", writer: "ResultsWriter") -> dict:
    """Each arm's search (metrics.slo_search.ArmSearch or metrics.capacity_search.CapacitySearch),
    from the recorded points (a capacity search reads their summary rows too)."""
    if cfg.sweep.capacity_search is not None:
        return cap.search_arms(writer.points, writer.rows, cfg.sweep.capacity_search, cfg.sweep.modes)
    spec = cfg.sweep.slo.resolved(cfg.sweep.rates)
    return {m: search_arm(m, [p for p in writer.points if p["mode"] == m], spec, cfg.sweep.repeats)
            for m in cfg.sweep.modes}


def record_capacity(cfg: "StudyConfig", writer: "ResultsWriter", found: dict) -> None:
    """The manifest's ``capacity_search`` and capacity.csv, and one console line for the round."""
    write_capacity_search(writer.dir, writer.manifest, cfg.sweep.capacity_search, found, cfg.sweep.baseline_arm())
    writer.save_manifest()
    line = f"capacity search after {len(writer.points)} points: " + "; ".join(s.line() for s in found.values())
    if writer.points and line != getattr(writer, "said", None):  # a round is planned once, maybe asked twice
        writer.said = line
        tqdm.write(line)


def record(cfg: "StudyConfig", writer: "ResultsWriter", found: dict) -> None:
    if cfg.sweep.capacity_search is not None:
        return record_capacity(cfg, writer, found)
    spec = cfg.sweep.slo.resolved(cfg.sweep.rates)
    writer.manifest["slo_search"] = {
        "objectives_ms": dict(spec.objectives), "tolerance": spec.tolerance, "growth": spec.growth,
        "start_rate_req_s": spec.start_rate, "max_rate_req_s": spec.max_rate, "min_rate_req_s": spec.min_rate,
        "repeats": cfg.sweep.repeats, "arms": {m: arm_record(s) for m, s in found.items()}}
    rows = [r for m in found for r in probe_rows(m, [p for p in writer.points if p["mode"] == m], spec.objectives)]
    cols = ["arm", "probe", "rate_req_s", "repeat", "verdict", *(f"{n}_ms" for n in spec.objectives),
            *(f"{n}_bound_ms" for n in spec.objectives)]
    atomic_write_csv(writer.dir / SLO_CSV, pd.DataFrame(rows, columns=cols))
    writer.save_manifest()


def pending(cfg: "StudyConfig", writer: "ResultsWriter") -> list[tuple["StudyConfig", RunPlan]]:
    """The next round, as Study.pending gives a sweep's points: (config restricted to the arms
    concerned, their plan); none when every arm's search has stopped.  Records the search so far."""
    found = searches(cfg, writer)
    record(cfg, writer, found)
    todo = {m: s.next_points for m, s in found.items() if s.next_points}
    if not todo:
        return []
    modes = [m for m in cfg.sweep.modes if m in todo]
    union = sorted({p for pts in todo.values() for p in pts}, key=lambda p: (p[1], p[0]))
    # The arms take turns: who goes first flips each round (RunPlan.turns flips odd repeats again).
    if (len(writer.points) // len(cfg.sweep.modes) + union[0][1]) % 2:
        modes = modes[::-1]
    # One config for the round, whatever the executor: interleaved arms take turns over it, arms side
    # by side on Ray run it at once, and either keeps its engines up for the next round; each arm
    # runs its own points (RunPlan.of).
    sub = cfg.model_copy(deep=True)
    sub.sweep.modes = modes
    sub.sweep.rates = sorted({r for r, _ in union})  # the places RunPlan.turns reads: this round's rates
    skip = frozenset((m, float(r), k) for m in modes for r, k in union if (r, k) not in todo[m])
    return [(sub, RunPlan(tuple(union), skip))]
