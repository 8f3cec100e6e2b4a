"""The command line: parse input, call the library, turn bad input into one line and exit 2."""

from __future__ import annotations

import functools
import logging
import os
import sys
from pathlib import Path

import click
import yaml

from prefixstudy import __version__
from prefixstudy.errors import UserError

DEFAULT_CONFIG = Path("experiments/default.yaml")


def user_errors(fn):
    """Bad input is one line on stderr and exit code 2; never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except UserError as e:
            click.echo(f"error: {e}", err=True)
            sys.exit(2)

    return wrapper


class Group(click.Group):
    """Every input error, ours or click's, is one line on stderr and exit code 2."""

    def main(self, *args, **kwargs):
        try:
            return super().main(*args, standalone_mode=False, **kwargs)
        except UserError as e:
            click.echo(f"error: {e}", err=True)
            sys.exit(2)
        except click.UsageError as e:
            where = f"{e.ctx.command_path}: " if e.ctx else ""
            click.echo(f"error: {where}{e.format_message()}", err=True)
            sys.exit(2)
        except click.exceptions.Exit as e:
            sys.exit(e.exit_code)
        except click.Abort:
            click.echo("aborted", err=True)
            sys.exit(130)
        except click.ClickException as e:
            e.show()
            sys.exit(e.exit_code)


@click.group(cls=Group)
@click.version_option(__version__, prog_name="prefixstudy")
def main():
    """How much vLLM's automatic prefix caching buys at each load, and why."""


def _csv_floats(ctx, param, value):
    if value is None:
        return None
    out = []
    for part in value.split(","):
        try:
            r = float(part)
        except ValueError:
            raise click.BadParameter(f"'{part}' is not a number") from None
        if not r > 0 or r != r or r == float("inf"):
            raise click.BadParameter(f"rates must be finite and > 0 req/s, got {part}")
        out.append(r)
    return out


def _csv_modes(ctx, param, value):
    if value is None:
        return None
    modes = [m.strip() for m in value.split(",")]
    for m in modes:
        if m not in ("on", "off"):
            raise click.BadParameter(f"'{m}' is not a mode; use on, off or on,off")
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


@main.command()
@click.argument("config", required=False, type=click.Path(path_type=Path))
@click.option("--out", type=click.Path(path_type=Path), help="Results root (default: the config's 'out').")
@click.option("--rates", callback=_csv_floats, help="Comma-separated request rates, req/s (e.g. 1,4,16).")
@click.option("--modes", callback=_csv_modes, help="Comma-separated subset of on,off.")
@click.option("--num-requests", type=click.IntRange(min=1), help="Measured requests per point (at least).")
@click.option("--executor", type=click.Choice(["auto", "local", "ray"]),
              help="Where engines run (auto: ray when installed, else local).")
@click.option("--ray-address", help="Ray cluster: local (start one here), auto, or ray://host:port.")
@click.option("--parallel", type=click.Choice(["auto", "on", "off"]),
              help="Ray: run caching ON and OFF side by side (auto: when the cluster has room).")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help="Override any config field, dotted.")
@click.option("--resume", type=click.Path(path_type=Path),
              help="Finish a run: only its missing or failed points, with its recorded config.")
@click.option("--report/--no-report", default=True, show_default=True, help="Build the report at the end.")
@click.option("--dry-run", is_flag=True, help="Check the config and dataset, print the plan, start nothing.")
@click.option("--quiet", is_flag=True, help="No progress bar; only the result lines.")
@click.option("-v", "--verbose", is_flag=True, help="Show vLLM's own log.")
def run(config, out, rates, modes, num_requests, executor, ray_address, parallel, sets, resume, report, dry_run,
        quiet, verbose):
    """Run a study: every rate against caching ON and OFF.  CONFIG defaults to experiments/default.yaml."""
    from prefixstudy.config import load_config

    overrides = _parse_sets(sets)
    if rates is not None:
        overrides["sweep.rates"] = rates
    if modes is not None:
        overrides["sweep.modes"] = [m.strip() for m in modes.split(",")]
    if num_requests is not None:
        overrides["sweep.num_requests"] = num_requests
    if out is not None:
        overrides["out"] = str(out)
    if executor is not None:
        overrides["executor"] = executor
    if ray_address is not None:
        overrides["ray.address"] = ray_address
    if parallel is not None:
        overrides["ray.parallel"] = parallel
    if resume is not None and (overrides or rates or modes):
        raise UserError("--resume takes the recorded config; drop the other run options")
    if config is None and resume is None:
        from prefixstudy.config import REPO_ROOT

        config = DEFAULT_CONFIG if DEFAULT_CONFIG.is_file() else REPO_ROOT / DEFAULT_CONFIG
    if not verbose:
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(message)s")
    cfg = load_config(config, overrides) if resume is None else None  # a bad config fails before pandas loads
    from prefixstudy.study import StudyFailed, Terminated, load_rows, run_study

    try:
        if resume is not None:
            run_dir = run_study(None, progress=not quiet, resume=resume, resume_config=config)
        else:
            rows = load_rows(cfg)  # validate the dataset before anything starts
            if dry_run:
                from prefixstudy.study import check_plan

                check_plan(cfg)
                from prefixstudy.executors import resolve_executor

                click.echo(f"ok: study {cfg.study}, {len(rows)} dataset rows, modes {','.join(cfg.sweep.modes)}, "
                           f"rates {','.join(f'{r:g}' for r in cfg.sweep.rates)} req/s, "
                           f"executor {resolve_executor(cfg.executor)}; nothing run (--dry-run)")
                return
            run_dir = run_study(cfg, progress=not quiet)
    except StudyFailed as e:
        click.echo(f"error: {e}; finished points are saved", err=True)
        sys.exit(1)
    except KeyboardInterrupt as e:
        where = getattr(e, "run_dir", "<run dir>")
        click.echo(f"interrupted: finished points are saved; continue with: prefixstudy run --resume {where}",
                   err=True)
        sys.exit(143 if isinstance(e, Terminated) else 130)
    click.echo(f"results: {run_dir}")
    if report:
        from prefixstudy.report import build_report

        click.echo(f"report: {build_report(run_dir)}")
    failed = _failed_points(run_dir)
    if failed:
        click.echo(f"{failed} point(s) failed (see manifest.json); run them again with: "
                   f"prefixstudy run --resume {run_dir}", err=True)
        sys.exit(1)


def _failed_points(run_dir: Path) -> int:
    import json

    manifest = json.loads((run_dir / "manifest.json").read_text())
    return sum(p.get("status") != "ok" for p in manifest.get("points", []))


@main.command()
@click.argument("runs", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--out", type=click.Path(path_type=Path), required=True, help="Results root for the merged run.")
def merge(runs, out):
    """Join runs of one study made apart (e.g. ON and OFF side by side, one GPU each) into one run."""
    from prefixstudy.study import merge_runs

    click.echo(f"results: {merge_runs(list(runs), out)}")


@main.group()
def dataset():
    """Make, import and inspect fixed-prompt datasets (JSONL of token ids)."""


@dataset.command("make")
@click.argument("out", type=click.Path(path_type=Path))
@click.option("-n", "--num-requests", type=click.IntRange(min=1), default=1000, show_default=True)
@click.option("--prefix-len", type=click.IntRange(min=0), default=1198, show_default=True)
@click.option("--suffix-len", type=click.IntRange(min=0), default=16, show_default=True)
@click.option("--output-len", type=click.IntRange(min=1), default=143, show_default=True)
@click.option("--groups", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--token-low", type=click.IntRange(min=0), default=100, show_default=True)
@click.option("--token-high", type=click.IntRange(min=1), default=32768, show_default=True,
              help="Exclusive upper bound; at most the model's vocab size.")
def dataset_make(out, num_requests, prefix_len, suffix_len, output_len, groups, seed, token_low, token_high):
    """Compose a fixed-prompt dataset at token level and save it as JSONL."""
    from prefixstudy import dataset as ds

    if prefix_len + suffix_len == 0:
        raise UserError("--prefix-len and --suffix-len are both 0: the prompts would be empty")
    if token_low >= token_high:
        raise UserError(f"--token-low {token_low} must be < --token-high {token_high}")
    rows = ds.make_dataset(num_requests, prefix_len, suffix_len, output_len, groups, seed, token_low, token_high)
    _save_rows(rows, out)
    click.echo(f"wrote {len(rows)} requests to {out}")


@dataset.command("import")
@click.argument("src", type=click.Path(path_type=Path))
@click.argument("out", type=click.Path(path_type=Path))
@click.option("--format", "fmt", type=click.Choice(["trtllm", "text"]), default="trtllm", show_default=True,
              help="trtllm: TensorRT-LLM token datasets (either shape); text: JSONL of {\"prompt\": ...}.")
@click.option("--output-len", type=click.IntRange(min=1), default=143, show_default=True,
              help="For text prompts without their own output_len.")
@click.option("--tokenizer", type=click.Path(path_type=Path), help="Tokenizer file (default: Mistral v3).")
def dataset_import(src, out, fmt, output_len, tokenizer):
    """Convert a TensorRT-LLM token dataset, or tokenize text prompts, into prefixstudy JSONL."""
    from prefixstudy import dataset as ds

    rows = ds.import_trtllm(src) if fmt == "trtllm" else ds.import_text(src, output_len, tokenizer)
    _save_rows(rows, out)
    click.echo(f"wrote {len(rows)} requests to {out}")


def _save_rows(rows, out: Path) -> None:
    """Write a dataset; a bad OUT path is bad input (one line, exit 2), not a traceback."""
    from prefixstudy import dataset as ds

    if out.is_dir():
        raise UserError(f"{out}: is a directory, expected a dataset file name")
    try:
        ds.save_jsonl(rows, out)
    except OSError as e:
        raise UserError(f"{out}: cannot write the dataset ({e.strerror or e})") from None


@dataset.command("show")
@click.argument("path", type=click.Path(path_type=Path))
def dataset_show(path):
    """Print a dataset's shape: requests, groups, lengths, shared prefix."""
    from prefixstudy import dataset as ds

    for k, v in ds.describe(ds.load_jsonl(path)).items():
        click.echo(f"{k}: {v}")


def _register_optional() -> None:
    """Commands from modules that other stages own; each imports nothing heavy at load time."""
    for mod, names in (("prefixstudy.cli.model", ["model"]),
                       ("prefixstudy.cli.report", ["report", "compare", "export_bench"])):
        try:
            m = __import__(mod, fromlist=names)
        except ImportError:
            continue
        for n in names:
            if hasattr(m, n):
                main.add_command(getattr(m, n))


_register_optional()

if __name__ == "__main__":
    main()
