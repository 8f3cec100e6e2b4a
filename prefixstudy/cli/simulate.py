"""``prefixstudy simulate``: a study config replayed through vLLM's own scheduler in virtual time,
priced by a step-cost model fitted on a calibration study; writes a real run's results layout.
The flags make the config's engine the simulated one (``engine.kind sim``), which runs through the
same sweep as a measured study."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from prefixstudy.cli.run import _console, _csv_floats, _csv_modes, _overrides
from prefixstudy.errors import UserError


@click.command()
@click.argument("config", type=click.Path(path_type=Path))
@click.option("--calibration", type=click.Path(path_type=Path),
              help="A study's results folder whose engine steps fit the step cost (or a cost_model.json); a run "
                   "without step records (an HTTP server's) is fitted to its request timestamps, the simulator "
                   "inside the fit; default: the config's engine.calibration (engine.kind sim).")
@click.option("--gpu", help="Simulate this GPU (costmodel/gpus.py names); default: the calibration's.")
@click.option("--tp", type=click.IntRange(min=1), help="Tensor-parallel degree; default: the config's.")
@click.option("--out", type=click.Path(path_type=Path), help="Results root (default: the config's 'out').")
@click.option("--rates", callback=_csv_floats, help="Comma-separated request rates, req/s.")
@click.option("--modes", callback=_csv_modes, help="Comma-separated subset of on,off.")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help="Override any config field, dotted.")
@click.option("--jobs", type=click.IntRange(min=1), default=1, show_default=True,
              help="Simulate points in this many processes.")
@click.option("--stepwise", is_flag=True,
              help="Every step through vLLM's scheduler, no decode lane (slower; the same results).")
@click.option("--capacity", is_flag=True,
              help="Search each arm's highest sustained arrival rate (sweep.capacity_search); writes capacity.csv.")
@click.option("--report/--no-report", default=True, show_default=True, help="Build the report at the end.")
@click.option("-v", "--verbose", is_flag=True, help="Show vLLM's own log.")
def simulate(config, calibration, gpu, tp, out, rates, modes, sets, jobs, stepwise, capacity, report, verbose):
    """Predict a study: CONFIG's sweep on the simulated engine (the whole sweep in seconds)."""
    from prefixstudy.config import load_config
    from prefixstudy.configs import resolve_config
    from prefixstudy.engines.registry import capabilities
    from prefixstudy.engines.sim import SimEngineConfig

    _console(verbose)
    config = resolve_config(config)
    overrides = _overrides(sets, rates=rates, modes=modes, out=out)
    if capacity:  # before the --set items, which may set its fields
        from prefixstudy.cli.run_flags import capacity_overrides

        overrides = {**capacity_overrides(config, None, rates), **overrides}
    cfg = load_config(config, overrides)
    if capabilities(cfg.engine.kind).virtual_time:  # the simulator's own config names its calibration
        calibration, gpu = calibration or Path(cfg.engine.calibration), gpu or cfg.engine.gpu
    elif calibration is None:
        raise UserError("--calibration: required (or a config with engine.kind sim and engine.calibration)")
    from prefixstudy.errors import StudyFailed
    from prefixstudy.costmodel.gpus import get_gpu
    from prefixstudy.study.preflight import need_vllm
    from prefixstudy.sweep.run_sweep import run_sweep

    need_vllm("prefixstudy simulate: the simulator replays vLLM's own scheduler, so it")  # before any results folder
    if gpu is not None:
        get_gpu(gpu)  # an unknown name is the flag's error
    cfg.engine = SimEngineConfig.replacing(cfg.engine, calibration=str(calibration), gpu=gpu, jobs=jobs,
                                           tensor_parallel_size=tp, stepwise=stepwise or None)
    try:
        run_dir = run_sweep(cfg, progress=False)
    except StudyFailed as e:  # the measured run's policy stopped it (checks.fail_on_hit_rate_mismatch)
        click.echo(f"error: {e}; the points simulated are saved in {getattr(e, 'run_dir', '?')}", err=True)
        sys.exit(1)
    click.echo(f"results: {run_dir}")
    from prefixstudy.report.capacity_search import console_lines

    for line in console_lines(run_dir):
        click.echo(line)
    from prefixstudy.sim.fit_requests import fit_error_line

    if line := fit_error_line(run_dir):
        click.echo(line)
    if report:
        from prefixstudy.report import build_report

        click.echo(f"report: {build_report(run_dir)}")
