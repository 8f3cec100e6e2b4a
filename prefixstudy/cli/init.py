"""``prefixstudy init DIR``: an editable copy of a shipped study config to start from."""

from __future__ import annotations

import shlex
from pathlib import Path

import click

from prefixstudy.errors import UserError

FILENAME = "prefixstudy.yaml"


def init_config(folder: Path, name: str) -> Path:
    """Copy the shipped config ``name`` to ``folder/prefixstudy.yaml``; never overwrites."""
    from prefixstudy.configs import shipped_config, shipped_configs

    src = shipped_config(name)
    if src is None:
        raise UserError(f"--from {name}: not a shipped config; shipped: {', '.join(shipped_configs())}")
    if folder.exists() and not folder.is_dir():
        raise UserError(f"{folder}: not a folder")
    dest = folder / FILENAME
    if dest.exists():
        raise UserError(f"{dest}: already exists; not overwriting it (remove it or pick another folder)")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with dest.open("x") as f:  # "x": a file that appeared meanwhile is not overwritten either
            f.write(f"# Made by `prefixstudy init` from the shipped config '{name}'; edit freely.\n")
            f.write(src.read_text())
    except FileExistsError:
        raise UserError(f"{dest}: already exists; not overwriting it (remove it or pick another folder)") from None
    except OSError as e:
        raise UserError(f"{dest}: cannot write ({e.strerror})") from None
    return dest


@click.command()
@click.argument("folder", required=False, default=".", type=click.Path(path_type=Path))
@click.option("--from", "name", default="default", show_default=True, metavar="NAME",
              help="The shipped config to copy (default, h200-tp1, ...).")
def init(folder, name):
    """Write FOLDER/prefixstudy.yaml (FOLDER defaults to .): a shipped study config to edit and run."""
    dest = init_config(folder, name)
    click.echo(f"wrote {dest} (the shipped '{name}')")
    click.echo(f"next: prefixstudy run {shlex.quote(str(dest))} --dry-run")
