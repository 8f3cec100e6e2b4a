"""``prefixstudy run`` and ``prefixstudy merge``: parse the flags into one config, call the study."""

from __future__ import annotations

import logging
import math
import os
import sys
import warnings
from pathlib import Path

import click
import yaml

from prefixstudy.errors import UserError


def _csv_floats(ctx, param, value):
    if value is None:
        return None
    out = []
    for part in value.split(","):
        try:
            r = float(part)
        except ValueError:
            raise click.BadParameter(f"'{part}' is not a number") from None
        if not r > 0 or math.isnan(r) or r == float("inf"):
            raise click.BadParameter(f"rates must be finite and > 0 req/s, got {part}")
        out.append(r)
    return out


def _csv_rates(ctx, param, value):
    """--request-rate: as --rates, and inf (every request at once)."""
    if value is None:
        return None
    parts = value.split(",")
    inf = [p.strip().lower() in ("inf", "infinity") for p in parts]
    finite = _csv_floats(ctx, param, ",".join(p for p, i in zip(parts, inf, strict=True) if not i)) if not all(inf) else []
    return finite + [float("inf")] * any(inf)


def _csv_modes(ctx, param, value):
    if value is None:
        return None
    modes = [m.strip() for m in value.split(",")]
    for m in modes:
        if not m:  # a name that is no arm is refused by the config, which knows the arms
            raise click.BadParameter(f"'{value}' has an empty arm name; use e.g. on,off or on,off,<arm>")
    return ",".join(modes)


def _parse_sets(values: tuple[str, ...]) -> dict:
    out = {}
    for item in values:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise UserError(f"--set {item}: expected key=value, for example --set sweep.num_requests=20")
        try:
            out[key] = yaml.safe_load(raw)
        except yaml.YAMLError:
            out[key] = raw
    return out


@click.command()
@click.argument("config", required=False, type=click.Path(path_type=Path))
@click.option("--out", type=click.Path(path_type=Path), help="Results root (default: the config's 'out').")
@click.option("--rates", callback=_csv_floats, help="Comma-separated request rates, req/s (e.g. 1,4,16).")
@click.option("--modes", callback=_csv_modes, help="Comma-separated arms to run: on, off and the config's arms.")
@click.option("--num-requests", type=click.IntRange(min=1), help="Measured requests per point (at least).")
@click.option("--executor", type=click.Choice(["auto", "local", "ray"]),
              help="Where engines run (auto: ray when installed, else local).")
@click.option("--ray-address", help="Ray cluster: local (start one here), auto, or ray://host:port.")
@click.option("--parallel", type=click.Choice(["auto", "on", "off"]),
              help="Ray: run the arms side by side (auto: when the cluster has room; else they take turns).")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help="Override any config field, dotted.")
@click.option("--resume", type=click.Path(path_type=Path),
              help="Finish a run: only its missing or failed points, with its recorded config.")
@click.option("--report/--no-report", default=True, show_default=True, help="Build the report at the end.")
@click.option("--dry-run", is_flag=True, help="Check the config and dataset, print the plan, start nothing.")
@click.option("--quiet", is_flag=True, help="No progress bar; only the result lines.")
@click.option("-v", "--verbose", is_flag=True, help="Show vLLM's own log.")
# The flags users of `vllm bench serve` and its peers expect; each sets config fields (run_flags.py).
@click.option("--request-rate", callback=_csv_rates, help="Like --rates, and 'inf' sends every request at once.")
@click.option("--max-concurrency", type=click.IntRange(min=1), help="At most N requests open (a closed loop at rate inf).")
@click.option("--seed", type=int, help="Seed of the arrivals and the dataset.")
@click.option("--burstiness", type=float, help="Gamma arrivals of this shape (< 1 burstier); not with Poisson.")
@click.option("--percentiles", help="Percentiles of the bench export, e.g. 50,90,95,99.")
@click.option("--goodput", help="Objectives in ms for goodput, e.g. ttft:200,e2e:2000.")
@click.option("--slo", help="Search each arm's highest rate meeting these, e.g. e2e_p90:2000,ttft_p90:500 (ms).")
@click.option("--capacity", is_flag=True, default=None,
              help="Search each arm's highest sustained arrival rate (sweep.capacity_search); writes capacity.csv.")
@click.option("--label", help="A name for this run (bench export label, manifest).")
@click.option("--metadata", multiple=True, metavar="KEY=VALUE", help="Recorded in the manifest and bench export.")
@click.option("--target-on", help="engine.kind http: base URL of the caching-ON server.")
@click.option("--target-off", help="engine.kind http: base URL of the caching-OFF server.")
def run(config, out, rates, modes, num_requests, executor, ray_address, parallel, sets, resume, report, dry_run,
        quiet, verbose, **peer):
    """Run a study: every rate against caching ON and OFF.

    CONFIG is a YAML file or the name of a shipped config (default, h200-tp1, ...); without it,
    the shipped default: a tiny model on the CPU."""
    from prefixstudy.config import load_config

    overrides = _overrides(sets, rates=rates, modes=modes, num_requests=num_requests, out=out, executor=executor,
                           ray_address=ray_address, parallel=parallel)
    if resume is not None and (overrides or any(v not in (None, (), False) for v in peer.values())):
        raise UserError("--resume takes the recorded config; drop the other run options")
    if resume is None:
        from prefixstudy.configs import resolve_config

        config = resolve_config(config)
        overrides = _with_peer_flags(config, rates, overrides, peer)
    _console(verbose)
    cfg = load_config(config, overrides) if resume is None else None  # a bad config fails before pandas loads
    if cfg is not None and cfg.sweep.capacity_search is not None and (rates or peer.get("request_rate")):
        raise UserError("--rates: a capacity search (sweep.capacity_search) searches its own rates; drop --rates / "
                        "--request-rate")
    if dry_run and cfg is not None:
        return _dry_run(cfg)
    from prefixstudy.results.sweep_folder import is_sweep

    run_dir = _run(cfg, resume, config, progress=not quiet)
    if is_sweep(run_dir):
        return _sweep_done(run_dir, report)
    _run_done(run_dir, report)


def _with_peer_flags(config, rates, overrides: dict, peer: dict) -> dict:
    """The --set items with the peer tools' flags (--slo, --capacity, --target-on/off, ...) merged in."""
    from prefixstudy.cli.run_flags import peer_overrides

    flags = peer_overrides(config, rates, **peer)
    if "sweep.capacity_search" in flags:  # before the --set items, which may set its fields
        overrides = {"sweep.capacity_search": flags.pop("sweep.capacity_search"), **overrides}
    if "engine" in flags:  # --target-on/off replace the engine section: the --set engine.* items go into it
        for key in [k for k in overrides if k.startswith("engine.")]:
            node = flags["engine"]
            *path, last = key.split(".")[1:]
            for part in path:
                node = node.setdefault(part, {})
            node[last] = overrides.pop(key)
    overrides.update(flags)
    return overrides


def _dry_run(cfg) -> None:
    """--dry-run: every check a run makes before its first engine starts, and what it would run."""
    from prefixstudy.engines.registry import capabilities
    from prefixstudy.executors import resolve_executor
    from prefixstudy.report.capacity_search import settings_line
    from prefixstudy.study.preflight import check_installed, check_offload_device, check_plan, device_problem
    from prefixstudy.sweep.axes import grid_axes
    from prefixstudy.sweep.run_sweep import cells
    from prefixstudy.workloads import load_rows

    rows = load_rows(cfg)
    check_plan(cfg)
    check_offload_device(cfg)
    check_installed(cfg)
    virtual = capabilities(cfg.engine.kind).virtual_time  # no executor, no device of this machine's
    cannot = device_problem(cfg) if not virtual else ""
    executor_name = resolve_executor(cfg.executor, cfg.engine.kind, cfg.ray.address)
    search = cfg.sweep.capacity_search
    click.echo(f"ok: study {cfg.study}, {len(rows)} dataset rows, modes {','.join(cfg.sweep.modes)}, "
               + ("capacity search" if search is not None else
                  f"rates {','.join(f'{r:g}' for r in cfg.sweep.rates)} req/s" if cfg.sweep.slo is None else
                  "SLO search " + ",".join(f"{k}:{v:g}" for k, v in cfg.sweep.slo.objectives.items()) + " ms")
               + (f" x {cfg.sweep.repeats} repeats" if cfg.sweep.repeats > 1 and search is None else "")
               + (f", {cfg.replicas} replicas routed by {','.join(cfg.router.policies)}" if cfg.replicas > 1 else "")
               + f", executor {'sim (virtual time)' if virtual else executor_name}; "
               "nothing run (--dry-run)")
    if search is not None:
        click.echo(settings_line(search, cfg.sweep.num_requests, cfg.sweep.max_point_duration_s))
    axes = grid_axes(cfg)
    if axes:  # every cell's config is built and checked as the run would
        grid = cells(cfg, axes)
        for cell in grid:
            check_plan(cell.cfg)
        click.echo(f"grid: {len(grid)} cells over {', '.join(a.name for a in axes)}, each a run folder under one "
                   f"parent: {', '.join(c.dir for c in grid)}")
    if cannot:  # a GPU study checked on a laptop: fine to check, not to run (a Ray cluster's GPUs may do)
        click.echo(f"note: cannot run here: {cannot}" + ("; a Ray cluster's GPUs would do"
                                                        if executor_name == "ray" else ""))


def _run_done(run_dir: Path, report: bool) -> None:
    """A finished run: its table, a capacity search's answer, its report, and the failed points with
    the one command that goes on with them (exit 1)."""
    from prefixstudy.report.capacity_search import console_lines

    _bench_table(run_dir)
    for line in console_lines(run_dir):  # a capacity search's answer: each arm's bracket and the ratio
        click.echo(line)
    click.echo(f"results: {run_dir}")
    if report:
        from prefixstudy.report import build_report

        click.echo(f"report: {build_report(run_dir)}")
    failed = [p for p in _manifest(run_dir).get("points", []) if p.get("status") != "ok"]
    if failed:
        first = failed[0]
        click.echo(f"error: {len(failed)} point(s) failed, the first: cache {str(first['mode']).upper()} @ "
                   f"{float(first['rate']):g} req/s: {first.get('error') or 'see manifest.json'}; "
                   f"run them again with: prefixstudy run --resume {run_dir}", err=True)
        sys.exit(1)


def _sweep_done(parent: Path, report: bool) -> None:
    """A grid's parent folder: each cell's report and the sweep's own (``report.sweep``), then
    the cells that failed, with the one command that goes on with them."""
    from prefixstudy.report.sweep import sweep_report

    for name, path in sweep_report(parent, cells=report):
        click.echo(f"{name}: {path}")
    click.echo(f"results: {parent}")
    exit_on_failed_cells(parent)


def exit_on_failed_cells(parent: Path) -> None:
    """Exit 1 when a cell of the sweep at ``parent`` has failed points or stopped, saying how many
    and the one command that goes on with them."""
    from prefixstudy.results.sweep_folder import cell_dirs

    manifests = [_manifest(d) for d in cell_dirs(parent)]
    failed = sum(_failed_in(m) for m in manifests)
    stopped = [m for m in manifests if m.get("status") == "failed"]
    if failed or stopped:
        click.echo(f"{failed} point(s) failed" + (f", {len(stopped)} cell run(s) stopped" if stopped else "")
                   + f" (see each cell's manifest.json); run them again with: prefixstudy run --resume {parent}",
                   err=True)
        sys.exit(1)


def _bench_table(run_dir: Path) -> None:
    """Every point's requests, throughput and TTFT / TPOT / E2E, as `vllm bench serve` users read them."""
    from prefixstudy.report.console import bench_table
    from prefixstudy.results import read_summary

    for line in bench_table(read_summary(Path(run_dir) / "summary.csv")):
        click.echo(line)


@click.command()
@click.argument("parent", type=click.Path(path_type=Path))
def routing(parent):
    """Rebuild routing.csv, replicas.csv and routing.md of a routing sweep (after a --resume)."""
    from prefixstudy.report.routing import routing_report

    click.echo(f"routing: {routing_report(parent)}")


def _overrides(sets, **flags) -> dict:
    """--set items, then the dedicated flags (which win), as dotted config keys."""
    out = _parse_sets(sets)
    keys = {"rates": "sweep.rates", "modes": "sweep.modes", "num_requests": "sweep.num_requests", "out": "out",
            "executor": "executor", "ray_address": "ray.address", "parallel": "ray.parallel"}
    for flag, given in flags.items():
        if given is not None:
            value = [m.strip() for m in given.split(",")] if flag == "modes" else given
            out[keys[flag]] = str(value) if flag == "out" else value
    return out


def _console(verbose: bool) -> None:
    """Quiet by default: prefixstudy's own progress bar, a line per point and where the results
    went.  vLLM's and torch's start-up notes (warnings about kernels and allocators the study does
    not depend on) are held back; -v shows everything.  The variables reach engine processes too."""
    if not verbose:
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
        os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
        # Engine processes, and multiprocessing's resource tracker, which reports at exit the shared
        # memory vLLM leaves for it to clean up.
        os.environ.setdefault("PYTHONWARNINGS", "ignore::FutureWarning,ignore::DeprecationWarning,"
                                                "ignore:resource_tracker:UserWarning")
        warnings.filterwarnings("ignore", category=FutureWarning)
        warnings.filterwarnings("ignore", category=DeprecationWarning)
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(message)s")


def _run(cfg, resume: Path | None, config: Path | None, progress: bool) -> Path:
    """The run or sweep (``sweep.run_sweep``), with its two ways of stopping early turned into exit
    codes (1, 130 / 143)."""
    from prefixstudy.study.orchestrate import StudyFailed
    from prefixstudy.sweep.run_sweep import run_sweep

    try:
        if resume is not None:
            return run_sweep(None, progress=progress, resume=resume, resume_config=config)
        return run_sweep(cfg, progress=progress)
    except StudyFailed as e:
        where = getattr(e, "run_dir", None)
        click.echo(f"error: {e}; finished points are saved"
                   + (f"; continue with: prefixstudy run --resume {where}" if where is not None else ""), err=True)
        sys.exit(1)
    except KeyboardInterrupt as e:
        _interrupted(e)


def _interrupted(e: KeyboardInterrupt) -> None:
    """Ctrl-C (exit 130) or SIGTERM (143): where the saved points are, or that there are none yet."""
    from prefixstudy.study.orchestrate import Terminated

    where = getattr(e, "run_dir", None)
    click.echo(f"interrupted: finished points are saved; continue with: prefixstudy run --resume {where}"
               if where is not None else "interrupted before any results were written", err=True)
    sys.exit(143 if isinstance(e, Terminated) else 130)


def _manifest(run_dir: Path) -> dict:
    import json

    return json.loads((run_dir / "manifest.json").read_text())


def _failed_in(manifest: dict) -> int:
    return sum(p.get("status") != "ok" for p in manifest.get("points", []))


@click.command(short_help="Join runs made apart, or capacity sweeps.")
@click.argument("runs", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--out", type=click.Path(path_type=Path), required=True, help="Results root for the merged run.")
def merge(runs, out):
    """Join runs of one study made apart (e.g. ON and OFF side by side, one GPU each) into one run;
    capacity sweeps into one sweep, capacity by capacity."""
    from prefixstudy.results.merge import merge_capacity, merge_runs
    from prefixstudy.results.sweep_folder import CAPACITY, axis_values, is_sweep, read_index

    sweeps = [is_sweep(r) and axis_values(read_index(r), CAPACITY) is not None for r in runs]
    if any(sweeps) and not all(sweeps):
        raise UserError("merge: give either run folders or capacity sweep folders, not both")
    if not all(sweeps):
        click.echo(f"results: {merge_runs(list(runs), out)}")
        return
    from prefixstudy.report.capacity import write_capacity_report

    parent = merge_capacity(list(runs), out)
    write_capacity_report(parent)
    click.echo(f"results: {parent}")


