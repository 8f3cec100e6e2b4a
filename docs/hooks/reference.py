"""mkdocs hook: the reference pages, generated at build time from the code so that they cannot
drift from it: reference/cli.md from the click commands, reference/config.md from the pydantic
config models (every field with its type, default and description; each engine kind's own
section), reference/results.md from the column tables of the results files (prefixstudy.schema,
prefixstudy.metrics.headline; a sweep's parent: prefixstudy.sweep.capacity_axis, prefixstudy.metrics.replicas)
and the manifest's key tables (prefixstudy.results.provenance)."""

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


def _cell(text: str) -> str:
    """Text for one cell of a markdown table."""
    return " ".join(text.split()).replace("|", "\\|")


def config_sections() -> list[tuple[str, type[BaseModel]]]:
    """(dotted prefix, model) of every section of the study config, in page order: each model
    once, at the first field that holds it, depth first (the tests walk the same list)."""
    from prefixstudy.config import StudyConfig

    out, seen = [], {StudyConfig}

    def walk(model: type[BaseModel], prefix: str) -> None:
        out.append((prefix, model))
        nested = []
        for name, field in model.model_fields.items():
            nested += [(m, f"{prefix}{name}") for m in _models(field.annotation) if m not in seen]
        for m, key in nested:
            if m not in seen:
                seen.add(m)
                walk(m, f"{key}.")

    walk(StudyConfig, "")
    return out


def model_table(model: type[BaseModel], prefix: str) -> list[str]:
    rows = []
    for name, field in model.model_fields.items():
        value = None if field.is_required() else field.get_default(call_default_factory=True)
        default = ("required" if field.is_required() else "its section below" if isinstance(value, BaseModel)
                   else str(value) if isinstance(value, Path) else repr(value))
        if len(default) > 60:
            default = default[:57] + "..."
        rows.append(f"| `{prefix}{name}` | `{_type(field.annotation)}` | `{default}` | "
                    f"{_cell(field.description or '')} |")
    return [f"## `{prefix.rstrip('.') or 'top level'}` ({model.__name__})", "",
            "| field | type | default | description |", "|---|---|---|---|", *rows, ""]


def config_page() -> str:
    out = ["# Config reference", "",
           "Every field of a study config, generated from the pydantic models when the site is built. "
           "`--set key=value` sets any of them from the command line; `engine` takes the fields of "
           "its `kind`'s section. A length (`dataset.mix.*_len`, `dataset.sessions.*`) is a number of "
           "tokens or a distribution, whose fields are listed once, under `dataset.mix.prefix_len`.", ""]
    for prefix, model in config_sections():
        out += model_table(model, prefix)
    return "\n".join(out)


def results_files() -> list[tuple[str, str, dict[str, tuple[str, str]]]]:
    """(file name, what one row is, {column: (dtype, meaning)}) of every table a run writes."""
    from prefixstudy.metrics.headline import ARMS_FIELDS, HEADLINE_FIELDS
    from prefixstudy.results.store import ARMS, HEADLINE, ITERATIONS, REQUESTS, SUMMARY
    from prefixstudy.schema import ITERATION_FIELDS, REQUEST_FIELDS, SUMMARY_FIELDS

    return [
        (REQUESTS, "One row per request, warm-ups included (`warmup`); a failed request is a row with its "
                   "`error`. A parquet dataset, one part per point.", REQUEST_FIELDS),
        (ITERATIONS, "One row per engine step, per point (echo: one row per request, `timing` `request`). "
                     "`timing` says where the step was timed: `engine` inside the engine core, one step at a "
                     "time (`step_ms` is the step's own busy time); `engine-async` the same stamps with vLLM's "
                     "async scheduling on (a record holds the next step's launch; not fitted); `frontend` gaps "
                     "between two StatLogger records (older runs); `request` a backend without steps.",
         ITERATION_FIELDS),
        (SUMMARY, "One row per point (arm x rate x repeat), written as each point finishes; the engine "
                  "columns are filled once every point is in (the step-cost fit needs them all).",
         SUMMARY_FIELDS),
        (HEADLINE, "One row per rate, over its repeats, with intervals, comparing two arms: the first arm other "
                   "than the baseline (`{arm}`) and the baseline (`sweep.baseline`); `{mode}` is each of them. "
                   "`on` and `off` by default, and where no baseline runs.",
         HEADLINE_FIELDS),
        (ARMS, "One row per rate x arm other than the baseline (written when the baseline ran).", ARMS_FIELDS),
    ]


def sweep_files() -> list[tuple[str, str, dict[str, tuple[str, str]]]]:
    """(file name, what one row is, {column: (dtype, meaning)}) of every table a capacity or routing
    sweep writes at its parent folder, beside one ordinary run folder per capacity or policy."""
    from prefixstudy.sweep.capacity_axis import CAPACITY_FIELDS, TABLE
    from prefixstudy.metrics.replicas import REPLICAS_FIELDS, REPLICAS_SUMMARY_FIELDS, ROUTING_FIELDS
    from prefixstudy.sweep.routing_axis import REPLICAS, REPLICAS_SUMMARY, ROUTING

    return [
        (TABLE, "A capacity sweep's parent (`prefixstudy capacity`, or sweeps joined by `prefixstudy merge`): "
                "one row per capacity x point, each point's summary.csv row with the capacity and the working "
                "set against it.", CAPACITY_FIELDS),
        (ROUTING, "A routing sweep's parent (`prefixstudy run` of a config with `replicas` > 1: a run per "
                  "`router.policies` entry): one row per policy x arm x "
                  "rate, over its repeats.", ROUTING_FIELDS),
        (REPLICAS, "A routing sweep's parent: one row per replica of each point (policy x arm x rate x repeat).",
         REPLICAS_FIELDS),
        (REPLICAS_SUMMARY, "A routing sweep's parent: one row per policy x arm x rate x replica, over its repeats.",
         REPLICAS_SUMMARY_FIELDS),
    ]


def results_page() -> str:
    out = ["# Results reference", "",
           "The columns of every table a run writes into `<out>/<study>/<run-id>/`, generated from the "
           "column tables in the code (`prefixstudy/schema.py`, `prefixstudy/metrics/headline.py`) when "
           "the site is built. `_ms` is milliseconds, `_s` seconds; `*_s` stamps are seconds since the "
           "point's start on the driver's monotonic clock. A counted request is a measured one (not a "
           "warm-up) that finished without error. The [metric definitions](metrics.md) say how each "
           "number is computed.", "",
           "Beside the tables: `config.yaml` (the resolved config, the fields of the "
           "[config reference](config.md)), [`manifest.json`](#manifestjson) (versions, device, times, "
           "the status of every point, the step-cost fit; its keys are at the end of this page) and, after "
           "`prefixstudy report`, `report.md`, `report.html` and `plots/`.", ""]
    for name, what, fields in results_files():
        out += column_table(name, what, fields)
    out += ["## Capacity and routing sweeps", "",
            "A sweep writes one ordinary run folder per capacity (`blocks-12`, ...) or policy (`policy-round_robin`, "
            "...) under one parent folder, with the tables above in each, and these tables at the parent "
            "(`capacity.json` / `routing.json` list the run folders). `prefixstudy routing PARENT` rebuilds a "
            "routing sweep's tables (after a `--resume`).", ""]
    for name, what, fields in sweep_files():
        out += column_table(name, what, fields)
    return "\n".join(out + manifest_section())


def manifest_section() -> list[str]:
    """manifest.json's keys, from the tables beside base_manifest (prefixstudy.results.provenance)."""
    from prefixstudy.results.provenance import MANIFEST_KEYS, POINT_KEYS

    def table(keys) -> list[str]:
        return ["| key | JSON type | in every run | meaning |", "|---|---|---|---|",
                *(f"| `{k}` | `{_cell(key.type)}` | {'no' if key.optional else 'yes'} | {_cell(key.meaning)} |"
                  for k, key in keys.items()), ""]

    return ["## `manifest.json`", "",
            "Written at the run's start and after every point, so it always says how far the run got. Keys not "
            "in every run are written only by some backends, executors or commands (the meaning says which). "
            "The tables are `MANIFEST_KEYS` and `POINT_KEYS` in `prefixstudy/results/provenance.py`.", "",
            "### Top-level keys", "", *table(MANIFEST_KEYS),
            "### A point's keys", "", "Each entry of `points`; \"in every run\" here means in every point's entry, "
            "a point that failed before it ran included.", "", *table(POINT_KEYS)]


def column_table(name: str, what: str, fields: dict[str, tuple[str, str]]) -> list[str]:
    return [f"## `{name}`", "", what, "", "| column | type | unit and meaning |", "|---|---|---|",
            *(f"| `{c}` | `{t}` | {_cell(doc)} |" for c, (t, doc) in fields.items()), ""]


# The pages this hook makes, under docs/ (tests/unit/test_docs_links.py counts links to them as found).
GENERATED = {"reference/cli.md": cli_page, "reference/config.md": config_page, "reference/results.md": results_page}


def on_files(files, config):
    for path, make in GENERATED.items():
        files.append(File.generated(config, path, content=make()))
    return files
