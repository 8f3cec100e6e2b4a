"""mkdocs hook: the reference pages, generated at build time from the code so that they cannot
drift from it: reference/cli.md from the click commands, reference/config.md from the pydantic
config models (every field with its type and default; each engine kind's own section)."""

from __future__ import annotations

import typing
from pathlib import Path

import click
from mkdocs.structure.files import File
from pydantic import BaseModel


def cli_page() -> str:
    from prefixstudy.cli import main

    out = ["# CLI reference", "", "Every command's `--help`, generated from the click commands when the site is built.", ""]

    def walk(cmd: click.Command, path: list[str], ctx: click.Context) -> None:
        out.extend([f"## `{' '.join(path)}`", "", "```text", cmd.get_help(ctx), "```", ""])
        if isinstance(cmd, click.Group):
            for name in cmd.list_commands(ctx):
                sub = cmd.get_command(ctx, name)
                walk(sub, [*path, name], click.Context(sub, info_name=name, parent=ctx))

    walk(main, ["prefixstudy"], click.Context(main, info_name="prefixstudy"))
    return "\n".join(out)


def _type(annotation) -> str:
    text = getattr(annotation, "__name__", None) if typing.get_origin(annotation) is None else None
    text = text or str(annotation).replace("typing.", "")
    return text.replace("prefixstudy.", "").replace("|", "\\|")


def _models(annotation) -> list[type[BaseModel]]:
    """The config models a field holds (itself, a list of them, or one of a union)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models(arg)]


def model_table(model: type[BaseModel], prefix: str, out: list[str], seen: set) -> None:
    rows, nested = [], []
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        subs = [m for m in _models(field.annotation) if m not in seen]
        value = None if field.is_required() else field.get_default(call_default_factory=True)
        default = ("required" if field.is_required() else "its section below" if isinstance(value, BaseModel)
                   else str(value) if isinstance(value, Path) else repr(value))
        if len(default) > 60:
            default = default[:57] + "..."
        rows.append(f"| `{key}` | `{_type(field.annotation)}` | `{default}` | {field.description or ''} |")
        nested += [(m, key) for m in subs]
    out.extend([f"## `{prefix.rstrip('.') or 'top level'}` ({model.__name__})", "",
                "| field | type | default | description |", "|---|---|---|---|", *rows, ""])
    for m, key in nested:
        if m not in seen:
            seen.add(m)
            model_table(m, f"{key}.", out, seen)


def config_page() -> str:
    from prefixstudy.config import StudyConfig

    out = ["# Config reference", "",
           "Every field of a study config, generated from the pydantic models when the site is built. "
           "`--set key=value` sets any of them from the command line; `engine` takes the fields of "
           "its `kind`'s section.", ""]
    model_table(StudyConfig, "", out, {StudyConfig})
    return "\n".join(out)


def on_files(files, config):
    for path, make in (("reference/cli.md", cli_page), ("reference/config.md", config_page)):
        files.append(File.generated(config, path, content=make()))
    return files
