"""The study-wide numbers of a run folder: the step-cost fit over every point's engine steps, the
engine columns of summary.csv it fills, and headline.csv (one row per rate, over repeats).

They need every point, so they are computed once a run, a merge or a report has them all, from
what is on disk: summary.csv, requests.parquet/ and iterations.parquet/.
"""

from __future__ import annotations

from pathlib import Path

from prefixstudy.engines.step_log import TIMING_METHODS
from prefixstudy.metrics.engine_fit import fit_step_cost
from prefixstudy.metrics.headline import headline
from prefixstudy.metrics.summary import add_engine_columns
from prefixstudy.results.store import HEADLINE, ITERATIONS, REQUESTS, SUMMARY, atomic_write_csv, read_table
from prefixstudy.schema import SUMMARY_COLUMNS, typed_iterations, typed_requests


def finish_run(run_dir: Path, manifest: dict) -> None:
    """Refit, refill and rewrite (pure analysis between the reads and the writes); records the fit
    in ``manifest`` (the caller saves it)."""
    from prefixstudy.results import read_summary

    summary = read_summary(run_dir / SUMMARY)
    if summary.empty:
        return
    summary = summary.reindex(columns=SUMMARY_COLUMNS)
    its = typed_iterations(read_table(run_dir / ITERATIONS))
    fit = fit_step_cost(its) if len(its) else None
    summary = add_engine_columns(summary, its, fit)
    atomic_write_csv(run_dir / SUMMARY, summary)
    manifest["step_fit"] = fit.as_dict() if fit is not None else None
    manifest["step_timing"] = sorted(set(its["timing"])) if len(its) else []
    manifest["step_timing_methods"] = {t: TIMING_METHODS.get(t, "") for t in manifest["step_timing"]}
    ok = summary[summary["status"] == "ok"]
    if len(ok):
        reqs = typed_requests(read_table(run_dir / REQUESTS))
        atomic_write_csv(run_dir / HEADLINE, headline(reqs, ok, its, fit))
