"""``prefixstudy dataset make|import|show``: fixed-prompt datasets as JSONL of token ids."""

from __future__ import annotations

from pathlib import Path

import click

from prefixstudy.errors import UserError


@click.group()
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
    from prefixstudy.workloads.fixed import make_dataset

    if prefix_len + suffix_len == 0:
        raise UserError("--prefix-len and --suffix-len are both 0: the prompts would be empty")
    if token_low >= token_high:
        raise UserError(f"--token-low {token_low} must be < --token-high {token_high}")
    rows = make_dataset(num_requests, prefix_len, suffix_len, output_len, groups, seed, token_low, token_high)
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
    if fmt == "trtllm":
        from prefixstudy.workloads.trtllm import import_trtllm

        rows = import_trtllm(src)
    else:
        from prefixstudy.workloads.text import import_text

        rows = import_text(src, output_len, tokenizer)
    _save_rows(rows, out)
    click.echo(f"wrote {len(rows)} requests to {out}")


def _save_rows(rows, out: Path) -> None:
    """Write a dataset; a bad OUT path is bad input (one line, exit 2), not a traceback."""
    from prefixstudy.workloads.jsonl import save_jsonl

    if out.is_dir():
        raise UserError(f"{out}: is a directory, expected a dataset file name")
    try:
        save_jsonl(rows, out)
    except OSError as e:
        raise UserError(f"{out}: cannot write the dataset ({e.strerror or e})") from None


@dataset.command("show")
@click.argument("path", type=click.Path(path_type=Path))
def dataset_show(path):
    """Print a dataset's shape: requests, groups, lengths, shared prefix."""
    from prefixstudy.workloads import describe
    from prefixstudy.workloads.jsonl import load_jsonl

    for k, v in describe(load_jsonl(path)).items():
        click.echo(f"{k}: {v}")


