"""A study's run once its folder exists: ``Study``, the sink executors report each point to, and
``run_pending``, the loop that runs the points still to do through an executor (a measured one,
or the simulator's) and closes the manifest with the run's status, whatever happens.

``study.run_study`` plans, checks and resumes; ``study.simulate.simulate`` hands its own executor here.
"""

from __future__ import annotations

import errno
import logging
from pathlib import Path
from typing import Any

from prefixstudy.study import slo_rounds
from prefixstudy.config import StudyConfig
from prefixstudy.errors import StudyFailed, first_line
from prefixstudy.executors import interleaved
from prefixstudy.metrics.saturation import failed_point
from prefixstudy.results.store import ENGINE_LOG, atomic_write_text
from prefixstudy.results.writer import ResultsWriter
from prefixstudy.schema import PointResult, point_key
from prefixstudy.executors.run_plan import RunPlan
from prefixstudy.workloads import DatasetRow

log = logging.getLogger(__name__)

DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


class Study:
    """The sink executors report to: writes each point, applies the hit-rate policy, keeps the manifest."""

    def __init__(self, cfg: StudyConfig, writer: ResultsWriter):
        self.cfg, self.writer = cfg, writer
        self.run_dir = writer.dir
        self._asked_at: list | None = None  # what was recorded when the SLO search's last round was planned

    def point_done(self, res: PointResult) -> dict:
        """Write the point and apply the policies on it: a point whose requests mostly failed is
        failed (a server answering errors is broken, not saturated).  Returns its summary row,
        status and error included."""
        slo_rounds.add_objective_values(self.cfg, res)
        row = self.writer.add(res)
        why = failed_point(res.requests) if row["status"] == "ok" else ""
        if why:
            self.writer.mark_failed(res.key, why)
            return row
        if not row["hit_rate_ok"]:
            msg = (f"cache {res.mode.upper()} @ {res.rate:g} req/s (repeat {res.repeat}): prefix hit rate "
                   f"{row['hit_rate_measured']:.3f}, expected {row['hit_rate_expected']:.3f} (infinite cache), "
                   f"{row['hit_rate_estimated']:.3f} with the engine's blocks")
            if self.cfg.checks.fail_on_hit_rate_mismatch:
                self.writer.mark_failed(res.key, f"hit-rate check: {msg}")
                raise StudyFailed(f"{msg} (checks.fail_on_hit_rate_mismatch is set)")
            log.warning("warning: %s", msg)
        return row

    def record(self, key: str, value: Any) -> None:
        self.writer.manifest[key] = value
        self.writer.save_manifest()

    def append_plan(self, plan: RunPlan) -> None:
        """The manifest's ``plans``: what each attempt set out to run (its points, and the arms'
        points it kept), beside the points it produced."""
        self.writer.manifest.setdefault("plans", []).append(plan.record())
        self.writer.save_manifest()

    def append(self, key: str, mode: str, value: Any) -> None:
        self.writer.manifest.setdefault(key, {}).setdefault(mode, []).append(value)
        self.writer.save_manifest()

    def pending(self) -> list[tuple[StudyConfig, RunPlan]]:
        """What is still to run, as (config restricted to the arms concerned, their plan): one
        pair when every arm lacks the same points (the arms may then run side by side), else one
        per arm; interleaved arms keep taking turns over every pending point, skipping the arms
        that have it."""
        cfg = self.cfg
        if slo_rounds.searching(cfg):  # a search's next round (prefixstudy.study.slo_rounds)
            self._asked_at = self._recorded()
            return slo_rounds.pending(cfg, self.writer)
        done = {point_key(p) for p in self.writer.points if p.get("status") == "ok"}
        pending = {m: [(r, k) for r, k in cfg.sweep.points() if (m, float(r), k) not in done] for m in cfg.sweep.modes}
        pending = {m: pts for m, pts in pending.items() if pts}
        if not pending:
            return []
        if len({tuple(pts) for pts in pending.values()}) == 1:
            groups = [(list(pending), next(iter(pending.values())))]
        elif interleaved(cfg):
            union = {p for pts in pending.values() for p in pts}
            groups = [(list(pending), [p for p in cfg.sweep.points() if p in union])]
        else:
            groups = [([m], pts) for m, pts in pending.items()]
        out = []
        for modes, pts in groups:
            sub = cfg.model_copy(deep=True)
            sub.sweep.modes = modes
            out.append((sub, RunPlan(tuple(pts), frozenset(d for d in done if d[0] in modes))))
        return out

    def next_round(self) -> list[tuple[StudyConfig, RunPlan]]:
        """After the pending points ran: a search's next round; a sweep has none."""
        kind = slo_rounds.searching(self.cfg)
        if kind is None:
            return []
        if self._recorded() == self._asked_at:
            raise StudyFailed(f"{'SLO' if kind == 'slo' else 'capacity'} search: a round recorded no point; "
                              "stopping rather than asking again")
        return self.pending()

    def take_round(self, modes: list[str]) -> tuple[StudyConfig, RunPlan] | None:
        """For an executor whose engines of ``modes`` are still up: an SLO search's next round when
        it runs on them alone (one config), so no engine starts again between rounds; None
        otherwise (then ``next_round`` hands it out, or nothing is left)."""
        if not slo_rounds.searching(self.cfg) or self._recorded() == self._asked_at:
            return None  # nothing recorded since the last round: next_round's check says so
        work = slo_rounds.pending(self.cfg, self.writer)
        if len(work) != 1 or not set(work[0][0].sweep.modes) <= set(modes):
            return None
        self._asked_at = self._recorded()
        self.append_plan(work[0][1])
        return work[0]

    def _recorded(self) -> list:
        return [(point_key(p), p.get("status")) for p in self.writer.points]


def run_pending(study: Study, executor, rows: list[DatasetRow], progress: bool) -> Path:
    """Run the pending points through ``executor`` (a measured one, or the simulator's); whatever
    happens, the manifest ends with the run's status.  A signal during the final summary (the step
    fit) stops it too: the run is then `interrupted` (run_study's SIGTERM handler covers it)."""
    status = "failed"
    try:
        try:
            work = study.pending()
            while work:  # a sweep: one pass; an SLO search: round after round
                for sub, plan in work:
                    study.append_plan(plan)
                    executor.run(sub, plan, rows, study, progress=progress)
                work = study.next_round()
            ok = all(p.get("status") == "ok" for p in study.writer.points)
            status = "complete" if ok else "complete_with_failures"
        except KeyboardInterrupt:
            status = "interrupted"
            raise
        except OSError as e:
            if e.errno not in DISK_FULL:
                raise
            status = "failed"  # nothing more is written: the summary and fit wait for the resume
            study.writer.manifest["error"] = f"failed: disk full ({first_line(e, limit=300)})"
            raise StudyFailed(f"disk full ({e.strerror}: {e.filename or study.run_dir}); free space first") from None
        except Exception as e:  # the reason stays with the run, not only on a console that may be gone
            log = getattr(e, "log", "")
            if log:  # an engine's own output (a Ray actor's, a server's): kept, and named in the one line
                path = study.run_dir / ENGINE_LOG
                atomic_write_text(path, log)
                study.writer.manifest["error_log"] = ENGINE_LOG
                e.args = (f"{e}; its log: {path}",)
            study.writer.manifest["error"] = first_line(e, limit=1000)
            raise
        finally:
            if status != "interrupted" and "disk full" not in study.writer.manifest.get("error", ""):
                # Ctrl-C means now: `prefixstudy report` finishes the run later
                try:
                    study.writer.finish()
                except KeyboardInterrupt:
                    status = "interrupted"
                    raise
    except (KeyboardInterrupt, Exception) as e:  # the CLI's resume hint names the folder
        e.run_dir = study.run_dir
        raise
    finally:
        study.writer.save_manifest(status=status, in_place_if_full=True)
    return study.run_dir
