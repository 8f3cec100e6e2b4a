"""CLI: ``prefixstudy report``, ``compare`` and ``export-bench``.  Parse, then call the library.

Registered by prefixstudy.cli with ``add_command``.  Nothing heavy is imported at
module load (pandas/matplotlib load inside the commands).  Bad input raises
UserError; the main CLI prints it as one line and exits 2.
"""

from __future__ import annotations

from pathlib import Path

import click

from prefixstudy.errors import UserError

_SLO_HELP = "Service-level objectives in ms, e.g. ttft=200,e2e=2000 (keys: ttft, e2e, tpot)."


def _slo(text: str | None) -> dict[str, float]:
    from prefixstudy.metrics.requests import parse_slo

    return parse_slo(text)


@click.command()
@click.argument("results_dir", type=click.Path(path_type=Path))
@click.option("--slo", default=None, help=_SLO_HELP)
@click.option("--threshold", "threshold_ms", type=float, default=None,
              help="p90 E2E threshold (ms) of the headline; default: the e2e SLO, else 2x OFF's p90 E2E at the lowest rate.")
@click.option("--peer", "peers", multiple=True,
              help="vllm bench serve results to overlay on the latency figures: a JSON file, a folder "
                   "(a bench sweep's too) or a glob (repeatable).")
@click.option("--point", default=None, metavar="[MODE] RATE",
              help="Point of the engine time series, e.g. 8 or 'on 8'; default: highest rate where both modes are unsaturated.")
@click.option("--seed", type=int, default=0, show_default=True, help="Bootstrap seed.")
@click.option("--rederive", is_flag=True,
              help="First recompute summary.csv, headline.csv, arms.csv and the manifest's derived fields from the "
                   "run's own request and step records with this version's analysis (saturation included); the "
                   "records and config.yaml are left as they are.  Prints the points whose saturation changed.")
def report(results_dir: Path, slo, threshold_ms, peers, point, seed, rederive):
    """Write report.md, report.html and plots/ (PNG + SVG) into RESULTS_DIR.  A sweep's folder gets
    each cell's report and the sweep's own (capacity, routing, or gain against hit rate)."""
    from prefixstudy.results.sweep_folder import is_sweep

    if is_sweep(results_dir):  # a grid's parent: each cell's report, then the sweep's own
        given = [f for f, v in (("--slo", slo), ("--threshold", threshold_ms), ("--peer", peers), ("--point", point))
                 if v]
        if given:
            raise UserError(f"{', '.join(given)}: for one run's report; {results_dir} is a sweep's folder (its "
                            "sweep.json): report one of its cells for those")
        if rederive:
            from prefixstudy.results.sweep_folder import cell_dirs

            for cell in cell_dirs(results_dir):
                _rederive(cell)
        from prefixstudy.report.sweep import sweep_report

        for name, path in sweep_report(results_dir):
            click.echo(f"{name}: {path}")
        click.echo(f"report: each cell's report.html, under {results_dir}")
        return
    from prefixstudy.report import build_report, parse_point

    if threshold_ms is not None and not threshold_ms > 0:
        raise UserError(f"--threshold {threshold_ms}: must be > 0 ms")
    parsed_slo = _slo(slo)
    parsed_point = parse_point(point)
    from prefixstudy.report.bench_import import bench_files

    for p in peers:
        if not any(c in p for c in "*?[") and not Path(p).exists():
            raise UserError(f"--peer {p}: file not found")
        bench_files(p)  # an empty folder or glob is refused now, not after the analysis
    if rederive:
        _rederive(results_dir)
    try:
        out = build_report(results_dir, parsed_slo, threshold_ms, peers, parsed_point, seed=seed)
    except OSError as e:  # a read-only or full filesystem: files are replaced whole, so none is left half-written
        raise UserError(f"{e.filename or results_dir}: cannot write the report ({e.strerror or e}); "
                        "the results themselves are untouched") from None
    click.echo(f"report: {out}")
    click.echo(f"report: {out.with_name('report.md')}")


def _rederive(results_dir: Path) -> None:
    from prefixstudy.results import find_run_dir
    from prefixstudy.results.rederive import rederive

    run = find_run_dir(results_dir)
    try:
        changed = rederive(run)
    except OSError as e:
        raise UserError(f"{e.filename or run}: cannot rewrite the derived files ({e.strerror or e}); "
                        "the records are untouched") from None
    click.echo(f"re-derived: {run} (summary.csv, headline.csv, manifest.json)")
    for c in changed.to_dict("records"):
        now = f"saturated: {c['saturation_reason']}" if c["saturated"] else "kept up"
        click.echo(f"  {c['mode'].upper()} {c['rate']:g} req/s repeat {c['repeat'] + 1}: "
                   f"{'saturated' if c['saturated_before'] else 'kept up'} -> {now}")


@click.command()
@click.argument("results_dirs", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--out", "out_dir", type=click.Path(path_type=Path), default=Path("compare"), show_default=True,
              help="Folder for the combined report.")
@click.option("--slo", default=None, help=_SLO_HELP)
@click.option("--threshold", "threshold_ms", type=float, default=None, help="p90 E2E threshold (ms) of the headlines.")
@click.option("--seed", type=int, default=0, show_default=True, help="Bootstrap seed.")
def compare(results_dirs, out_dir, slo, threshold_ms, seed):
    """Overlay several studies (labelled study / device / TP) in one report; a sweep's folder gives
    each of its cells."""
    from prefixstudy.report import build_compare

    out = build_compare(results_dirs, out_dir, _slo(slo), threshold_ms, seed=seed)
    click.echo(f"report: {out}")


@click.command(name="export-bench")
@click.argument("results_dir", type=click.Path(path_type=Path))
@click.option("--out", "out_dir", type=click.Path(path_type=Path), default=None,
              help="Folder for the JSON files; default RESULTS_DIR/bench.")
@click.option("--slo", default=None, help=_SLO_HELP + " Fills request_goodput (default: the run's --goodput).")
@click.option("--save-detailed", is_flag=True, help="Add the per-request arrays, as vLLM's --save-detailed.")
@click.option("--layout", type=click.Choice(["flat", "sweep"]), default="flat", show_default=True,
              help="flat: one file per point and repeat; sweep: vLLM's bench sweep folders (a run per repeat), "
                   "for `vllm bench sweep plot`.")
def export_bench(results_dir, out_dir, slo, save_detailed, layout):
    """Write every point (each repeat apart) as a `vllm bench serve` result JSON."""
    from prefixstudy.report.bench_json import export_bench as _export
    from prefixstudy.results import load

    parsed = _slo(slo)
    study = load(results_dir)
    if study.requests.empty:
        raise UserError(f"{study.path}: no requests recorded yet; nothing to export")
    paths = _export(study, out_dir, slo=parsed, detailed=save_detailed, layout=layout)  # summary.csv's finished points
    click.echo(f"wrote {len(paths)} files to {paths[0].parent if paths else out_dir}")


@click.command()
@click.argument("results_dirs", nargs=-1, required=True, type=click.Path(path_type=Path))
def check(results_dirs):
    """Run the step-timing invariants on each results folder; exit 1 if any fails."""
    from prefixstudy.costmodel.engine_fit import busy_steps, fit_step_cost
    from prefixstudy.metrics.step_checks import check_steps
    from prefixstudy.report.tables import step_check_lines
    from prefixstudy.results import ITERATIONS, find_run_dir, read_table
    from prefixstudy.results.migrate import migrate
    from prefixstudy.schema import typed_iterations

    runs = [find_run_dir(d) for d in results_dirs]
    for run in runs:
        if not (run / ITERATIONS).exists():
            raise UserError(f"{run}: no {ITERATIONS} (not a finished or started run)")
    failed = False
    for run in runs:
        its = typed_iterations(migrate({"iterations": read_table(run / ITERATIONS)}, {})[0]["iterations"])
        fit = fit_step_cost(its, n_boot=0) if len(busy_steps(its)) else None
        checks = check_steps(its, fit.coef if fit is not None else None)
        click.echo(f"{run}: {({True: 'ok', False: 'FAILED', None: 'not judged'})[checks['ok'] if checks else None]}")
        for line in step_check_lines(checks):
            click.echo(f"  {line}")
        failed |= bool(checks) and checks["ok"] is False
    if failed:
        raise SystemExit(1)  # a violation: not bad input (2), a failed check
