"""``prefixstudy capacity``: a study at several KV-cache sizes (one run folder each, under one
parent), then the table across them; ``prefixstudy breakdown``: per-turn or per-group tables."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from prefixstudy.errors import UserError

from prefixstudy.cli.run import _console, _overrides, exit_on_failed_cells


@click.command()
@click.argument("config", type=click.Path(path_type=Path))
@click.option("--capacity", "capacity", required=True, metavar="UNIT=V1,V2,...",
              help="KV-cache sizes: blocks=12,16 | bytes=268435456,536870912 | share=0.1,0.2; or the CPU tier's, "
                   "on the study's own caching arms: offload_gib=0,4,8,16,32 (vLLM) | tier_blocks=0,64 (echo).")
@click.option("--out", type=click.Path(path_type=Path), help="Results root (default: the config's 'out').")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help="Override any config field, dotted.")
@click.option("--quiet", is_flag=True, help="No progress bar; only the result lines.")
@click.option("-v", "--verbose", is_flag=True, help="Show vLLM's own log.")
def capacity(config, capacity, out, sets, quiet, verbose):
    """Run CONFIG once per KV-cache size; write capacity.csv (hit rate and gain vs working set ÷ capacity)."""
    from prefixstudy.sweep.capacity_axis import collapse_lines, parse_capacity, sweep_arms
    from prefixstudy.config import load_config
    from prefixstudy.configs import resolve_config
    from prefixstudy.metrics.breakdown import markdown
    from prefixstudy.report.capacity import write_capacity_report
    from prefixstudy.sweep.run_sweep import run_sweep

    unit, values = parse_capacity(capacity)
    cfg = load_config(resolve_config(config), _overrides(sets, out=out))
    if any(k.startswith("capacity.") for k in cfg.grid):
        raise UserError(f"--capacity: the config's grid already sweeps {next(k for k in cfg.grid if k.startswith('capacity.'))}")
    cfg.grid = {f"capacity.{unit}": values, **cfg.grid}  # the outermost axis
    _console(verbose)
    parent = _sweep(run_sweep, cfg, progress=not quiet)
    table = write_capacity_report(parent)
    cols = ["capacity", "policy", "num_blocks", "tier_blocks", "working_set_ratio", "reuse_footprint_ratio", "mode", "rate",
            "hit_rate_measured", "hit_rate_estimated", "hit_rate_expected", "mean_e2e_ms", "e2e_gain"]
    click.echo(markdown(table[[c for c in cols if c in table]]))  # policy: only a sweep of several
    for line in collapse_lines(table, arm=sweep_arms(parent)[0]):
        click.echo(line)
    click.echo(f"results: {parent}")
    exit_on_failed_cells(parent)


def _sweep(run, *args, **kwargs):
    """The sweep, with its ways of stopping early as `prefixstudy run` has them (exit 1, 130 / 143)."""
    from prefixstudy.study.orchestrate import StudyFailed, Terminated

    try:
        return run(*args, **kwargs)
    except StudyFailed as e:
        click.echo(f"error: {e}; finished capacities and points are saved", err=True)
        sys.exit(1)
    except KeyboardInterrupt as e:
        where = getattr(e, "run_dir", None)
        click.echo("interrupted: finished capacities and points are saved"
                   + (f"; continue with: prefixstudy run --resume {where}" if where is not None else ""), err=True)
        sys.exit(143 if isinstance(e, Terminated) else 130)


@click.command()
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option("--by", type=click.Choice(["turn", "group"]), default="turn", show_default=True)
def breakdown(run_dir, by):
    """Cached share, TTFT and E2E per turn or per prefix group, every arm against the baseline, for one run."""
    from prefixstudy.metrics.breakdown import breakdown as table, markdown
    from prefixstudy.results import load
    from prefixstudy.results.finish import study_arms

    res = load(run_dir)
    click.echo(markdown(table(res.requests, by, study_arms(res)[1])))
