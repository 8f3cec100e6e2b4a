"""The command line: one group, one error path.  Each command lives in its own file, parses its
input and calls the library; bad input anywhere raises UserError, which becomes one line on stderr
and exit code 2 here, and nowhere else."""

from __future__ import annotations

import logging
import multiprocessing
import os
import re
import sys

import click

from prefixstudy import __version__
from prefixstudy.errors import UserError


# One objective of vLLM's --goodput: ttft:200, e2el:2000, tpot=50.
_GOODPUT_ITEM = re.compile(r"(ttft|tpot|e2el?)[:=][0-9.]+([eE][-+]?[0-9]+)?")


def join_goodput(argv: list[str]) -> list[str]:
    """``--goodput ttft:200 e2e:2000``, vLLM's form, gives each objective its own argument; a click
    option takes one value, so the objectives right after --goodput join it (anything else, such as
    a config name, stays an argument of its own)."""
    out, i = [], 0
    while i < len(argv):
        out.append(argv[i])
        i += 1
        if out[-1] == "--goodput" and i < len(argv):
            items = [argv[i]]
            i += 1
            while i < len(argv) and _GOODPUT_ITEM.fullmatch(argv[i]):
                items.append(argv[i])
                i += 1
            out.append(" ".join(items))
        elif out[-1] == "--":
            out += argv[i:]
            break
    return out


class Group(click.Group):
    """Every input error, ours or click's, is one line on stderr and exit code 2."""

    def main(self, args=None, *rest, **kwargs):
        try:
            args = join_goodput(sys.argv[1:] if args is None else list(args))
            return super().main(args, *rest, standalone_mode=False, **kwargs)
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


def _quiet_spawned_child() -> None:
    """A process that multiprocessing spawned from a quiet `prefixstudy run` (vLLM's engine core,
    under the local executor) imports this module first: it re-runs the parent's main module,
    which is this CLI.  vLLM's import-time notes there ("Triton is installed, but doesn't include
    CPU backend") come before vLLM configures its logging, so VLLM_LOGGING_LEVEL, which the parent
    set (cli.run._console), does not hold them back yet; this does.  Under `python -m prefixstudy`
    the child re-runs nothing (multiprocessing skips a package's __main__), and the note shows."""
    # The child is named before it re-runs the main module; parent_process() is set only after.
    if multiprocessing.current_process().name != "MainProcess" and os.environ.get("VLLM_LOGGING_LEVEL") == "ERROR":
        logging.getLogger("vllm").setLevel(logging.ERROR)


_quiet_spawned_child()


@click.group(cls=Group)
@click.version_option(__version__, prog_name="prefixstudy")
def main():
    """How much vLLM's automatic prefix caching buys at each load, and why."""


# Command modules import nothing heavy at load time (pandas, vLLM and Ray load inside the commands),
# so registering them all costs little; an import error here is a bug and must show, not hide a command.
from prefixstudy.cli import capacity, dataset, init, model, report, run  # noqa: E402
from prefixstudy.cli import simulate  # noqa: E402

main.add_command(run.run)
main.add_command(run.merge)
main.add_command(run.routing)
main.add_command(dataset.dataset)
main.add_command(model.model)
main.add_command(init.init)
main.add_command(simulate.simulate)
main.add_command(capacity.capacity)
main.add_command(capacity.breakdown)
for _cmd in (report.report, report.check, report.compare, report.export_bench):
    main.add_command(_cmd)

# `prefixstudy --help` lists each command with a line that fits an 80-column terminal whole; click
# would cut the docstring's first sentence mid-phrase.  Each command's own --help has the full text.
SHORT_HELP = {
    "breakdown": "Cached share, TTFT and E2E per turn or prefix group.",
    "capacity": "Run a config once per KV-cache size.",
    "check": "Check a run's step timing; exit 1 on a violation.",
    "compare": "Overlay several studies in one report.",
    "dataset": "Make, import and inspect fixed-prompt datasets.",
    "export-bench": "Write points as `vllm bench serve` result files.",
    "init": "Write a shipped study config to edit and run.",
    "merge": "Join runs made apart, or capacity sweeps.",
    "model": "First-principles prefill/decode model.",
    "report": "Write a study's report (Markdown, HTML, plots).",
    "routing": "Rebuild a routing sweep's tables.",
    "run": "Run a study: every rate against caching ON and OFF.",
    "simulate": "Predict a study with vLLM's scheduler in virtual time.",
}
for _name, _text in SHORT_HELP.items():
    main.commands[_name].short_help = _text



def entrypoint() -> None:
    """The ``prefixstudy`` script: the CLI, then a quiet interpreter teardown when vLLM's native
    libraries were loaded in this process (the local executor): their nanobind finalizers print
    hundreds of "leaked function" lines at exit, after the results line.  Teardown itself still
    runs (engine shared memory is released); only what it prints on stderr is dropped."""
    try:
        main()
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
        if isinstance(e.code, str):
            print(e.code, file=sys.stderr)
    if "triton" in sys.modules:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(os.open(os.devnull, os.O_WRONLY), 2)
    sys.exit(code)


if __name__ == "__main__":
    entrypoint()
