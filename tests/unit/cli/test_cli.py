"""CLI happy paths that need no engine: --version, dataset make / show / import.

Driven through the real CLI in a subprocess, like a user would; bad input is in test_bad_input.py.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from prefixstudy.workloads.base import DatasetRow
from prefixstudy.workloads.fixed import make_dataset
from prefixstudy.workloads.jsonl import load_jsonl
from tests import forkcli

REPO = Path(__file__).resolve().parents[3]


def cli(*args) -> subprocess.CompletedProcess:
    r = forkcli.run(args, cwd=REPO, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    return r


def test_version():
    assert cli("--version").stdout == "prefixstudy, version 0.1.0\n"


def test_dataset_make_then_show_default_shape(tmp_path):
    out = tmp_path / "d.jsonl"
    assert cli("dataset", "make", out, "-n", 5).stdout == f"wrote 5 requests to {out}\n"
    assert cli("dataset", "show", out).stdout.splitlines() == [
        "requests: 5",
        "groups: 1",
        "prompt_tokens_min: 1214",
        "prompt_tokens_max: 1214",
        "output_tokens_min: 143",
        "output_tokens_max: 143",
        "max_sequence_tokens: 1357",
        "shared_prefix_tokens: 1198",
    ]
    rows = load_jsonl(out)
    assert [r.request_id for r in rows] == ["r000000", "r000001", "r000002", "r000003", "r000004"]
    assert rows == make_dataset(5)  # the CLI's defaults are the library's


def test_dataset_make_then_show_two_groups(tmp_path):
    out = tmp_path / "d.jsonl"
    cli("dataset", "make", out, "-n", 6, "--prefix-len", 10, "--suffix-len", 3, "--output-len", 7,
        "--groups", 2, "--seed", 3)
    assert cli("dataset", "show", out).stdout.splitlines() == [
        "requests: 6",
        "groups: 2",
        "prompt_tokens_min: 13",
        "prompt_tokens_max: 13",
        "output_tokens_min: 7",
        "output_tokens_max: 7",
        "max_sequence_tokens: 20",
        "shared_prefix_tokens: 10",
    ]
    rows = load_jsonl(out)
    assert [r.group for r in rows] == [0, 1, 0, 1, 0, 1]
    assert rows[0].prompt_token_ids[:10] == rows[2].prompt_token_ids[:10] != rows[1].prompt_token_ids[:10]


def _trtllm_source(tmp_path: Path, rows: list[DatasetRow], shape: str) -> Path:
    """The made dataset written as TensorRT-LLM writes its token datasets."""
    if shape == "prepare_dataset-jsonl":
        src = tmp_path / "trt.jsonl"
        src.write_text("".join(json.dumps({"task_id": i, "input_ids": r.prompt_token_ids,
                                           "output_tokens": r.output_len}) + "\n" for i, r in enumerate(rows)))
    else:
        src = tmp_path / "trt.json"
        src.write_text(json.dumps({
            "metadata": {"workload_type": "token-norm-dist", "num_requests": len(rows)},
            "samples": [{"input_ids": r.prompt_token_ids, "output_len": r.output_len, "task_id": i}
                        for i, r in enumerate(rows)],
        }, indent=2))
    return src


@pytest.mark.parametrize("shape", ["prepare_dataset-jsonl", "gptManagerBenchmark-json"])
def test_dataset_import_trtllm_round_trip(tmp_path, shape):
    made = tmp_path / "made.jsonl"
    cli("dataset", "make", made, "-n", 4, "--prefix-len", 70, "--suffix-len", 5, "--output-len", 9, "--groups", 2)
    rows = load_jsonl(made)
    src = _trtllm_source(tmp_path, rows, shape)
    out = tmp_path / "imported.jsonl"
    assert cli("dataset", "import", src, out, "--format", "trtllm").stdout == f"wrote 4 requests to {out}\n"
    back = load_jsonl(out)
    assert [r.request_id for r in back] == ["t0", "t1", "t2", "t3"]
    assert [r.prompt_token_ids for r in back] == [r.prompt_token_ids for r in rows]
    assert [r.output_len for r in back] == [9, 9, 9, 9]
    assert [r.group for r in back] == [0, 1, 0, 1]  # grouped by their shared first 64 tokens
    assert cli("dataset", "show", out).stdout.splitlines() == [
        "requests: 4",
        "groups: 2",
        "prompt_tokens_min: 75",
        "prompt_tokens_max: 75",
        "output_tokens_min: 9",
        "output_tokens_max: 9",
        "max_sequence_tokens: 84",
        "shared_prefix_tokens: 70",
    ]


def test_yaml_bare_on_off_are_modes(tmp_path):
    """YAML 1.1 reads `modes: [on, off]` as booleans; the config takes them as the modes meant."""
    from prefixstudy.config import load_config

    p = tmp_path / "c.yaml"
    p.write_text("sweep:\n  modes: [off, on]\n")
    assert load_config(p).sweep.modes == ["off", "on"]
    assert load_config(p, {"sweep.modes": [True]}).sweep.modes == ["on"]  # --set sweep.modes=[on]
    p.write_text("ray:\n  parallel: on\n")
    assert load_config(p).ray.parallel == "on"
    p.write_text("ray:\n  parallel: off\n")
    assert load_config(p).ray.parallel == "off"
    p.write_text("sweep:\n  modes: [on, off]\n  baseline: off\n")
    assert load_config(p).sweep.baseline == "off"


@pytest.mark.slow
def test_capacity_sweep_and_breakdown_commands_on_the_echo_backend(tmp_path):
    import yaml

    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({
        "study": "cap", "executor": "local", "engine": {"kind": "echo", "block_size": 16},
        "arrivals": {"process": "constant"},
        "dataset": {"kind": "groups", "groups": 6, "prefix_len": 32, "suffix_len": 4, "output_len": 2},
        "sweep": {"rates": [50], "num_requests": 12, "warmup_requests": 0}}))
    r = cli("capacity", cfg, "--capacity", "blocks=14,12", "--out", tmp_path / "res", "--quiet")
    assert r.returncode == 0, r.stderr
    assert ("50 req/s: the hit rate collapses between blocks cached between two uses ÷ capacity 0.92 (hit rate 0.889"
            in r.stdout)
    parent = Path(r.stdout.strip().splitlines()[-1].removeprefix("results: "))
    assert sorted(p.name for p in parent.iterdir()) == ["blocks-12", "blocks-14", "capacity.csv", "capacity.md",
                                                        "capacity.png", "capacity.svg", "config.yaml", "sweep.json"]
    b = cli("breakdown", parent / "blocks-14", "--by", "group")
    assert b.stdout.count("| on | 50 |") == 6 and b.stdout.count("| off | 50 |") == 6


def test_the_command_list_fits_80_columns_whole():
    """Each command's line in `prefixstudy --help` is its whole SHORT_HELP, never a phrase cut with '...'."""
    from click.testing import CliRunner

    from prefixstudy.cli import SHORT_HELP, main

    assert set(SHORT_HELP) == set(main.commands)
    out = CliRunner().invoke(main, ["--help"], terminal_width=80).output
    listed = dict(ln.split(maxsplit=1) for ln in out.split("Commands:\n")[1].splitlines() if ln.strip())
    assert listed == SHORT_HELP
