"""The study-wide numbers of a run folder: the step-cost fit over every point's engine steps, the
engine columns of summary.csv it fills, the step-timing checks (``metrics.step_checks``),
headline.csv (one row per rate, over repeats) and arms.csv (every arm against the baseline arm).

They need every point, so they are computed once a run, a merge or a report has them all, from
what is on disk: summary.csv, requests.parquet/ and iterations.parquet/.
"""

from __future__ import annotations

from pathlib import Path

from prefixstudy.config.arms import compared
from prefixstudy.engines.step_log import TIMING_METHODS
from prefixstudy.costmodel.engine_fit import fit_by_kind, fit_step_cost
from prefixstudy.metrics.headline import headline, versus_baseline
from prefixstudy.metrics.step_checks import check_steps
from prefixstudy.metrics.summary import add_engine_columns
from prefixstudy.results.migrate import migrate
from prefixstudy.results.store import (ARMS, CONFIG, HEADLINE, ITERATIONS, REQUESTS, SUMMARY, atomic_write_csv,
                                       read_table)
from prefixstudy.schema import SUMMARY_COLUMNS, typed_iterations, typed_requests


def finish_run(run_dir: Path, manifest: dict) -> None:
    """Refit, refill and rewrite (pure analysis between the reads and the writes); records the fit
    in ``manifest`` (the caller saves it)."""
    from prefixstudy.results import read_summary

    frames, _ = migrate({"summary": read_summary(run_dir / SUMMARY), "iterations": read_table(run_dir / ITERATIONS)},
                        manifest)
    summary = frames["summary"]
    if summary.empty:
        return
    summary = summary.reindex(columns=SUMMARY_COLUMNS)
    its = typed_iterations(frames["iterations"])
    fit = fit_step_cost(its) if len(its) else None
    summary = add_engine_columns(summary, its, fit)
    atomic_write_csv(run_dir / SUMMARY, summary)
    manifest["step_fit"] = {**fit.as_dict(), "by_kind": fit_by_kind(its, fit.coef)} if fit is not None else None
    manifest["step_timing"] = sorted(set(its["timing"])) if len(its) else []
    manifest["step_checks"] = check_steps(its, fit.coef if fit is not None else None)
    manifest["step_timing_methods"] = {t: TIMING_METHODS.get(t, "") for t in manifest["step_timing"]}
    ok = summary[summary["status"] == "ok"]
    if len(ok):
        reqs = typed_requests(read_table(run_dir / REQUESTS))
        arms, baseline = recorded_arms(run_dir, summary)
        atomic_write_csv(run_dir / HEADLINE, headline(reqs, ok, its, fit, compared(arms, baseline)))
        if baseline is not None:
            atomic_write_csv(run_dir / ARMS, versus_baseline(reqs, ok, arms, baseline))


def recorded_arms(run_dir: Path, summary) -> tuple[list[str], str | None]:
    """The arms of a run in the config's order, and its baseline, from its config.yaml
    (``arms_of``)."""
    import yaml

    sweep = {}
    if (run_dir / CONFIG).is_file():
        sweep = (yaml.safe_load((run_dir / CONFIG).read_text()) or {}).get("sweep") or {}
    return arms_of(sweep, summary)


def study_arms(study) -> tuple[list[str], str | None]:
    """``arms_of`` a loaded run (``results.load``)."""
    return arms_of(study.config.get("sweep") or {}, study.summary)


def arms_of(sweep: dict, summary) -> tuple[list[str], str | None]:
    """The arms that ran in the order of the recorded config's ``sweep`` section, and its baseline
    (recorded before arms: on, off and OFF); arms without points are left out."""
    ran = list(dict.fromkeys(summary["mode"]))
    order = [m for m in sweep.get("modes") or ["on", "off"] if m in ran] + \
            [m for m in ran if m not in (sweep.get("modes") or ["on", "off"])]
    baseline = sweep.get("baseline") or ("off" if "off" in ran else None)
    return order, (baseline if baseline in ran else None)
