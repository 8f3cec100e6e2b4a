"""``prefixstudy simulate`` bad input: one line on stderr naming the flag or file, exit 2, no
results folder.  Driven through the real CLI in a subprocess; none gets as far as importing vLLM."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests import forkcli

REPO = Path(__file__).resolve().parents[3]


def cli(*args) -> subprocess.CompletedProcess:
    return forkcli.run(args, cwd=REPO, timeout=120)


def one_line_exit_2(r: subprocess.CompletedProcess, text: str) -> None:
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and text in lines[0], r.stderr


@pytest.mark.slow
def test_a_calibration_folder_without_a_manifest(tmp_path):
    r = cli("simulate", "h200-tp1", "--calibration", tmp_path, "--out", tmp_path / "out")
    one_line_exit_2(r, f"--calibration {tmp_path}: no readable manifest.json")
    assert not (tmp_path / "out").exists()


def test_an_unknown_gpu(tmp_path):
    r = cli("simulate", "h200-tp1", "--calibration", "experiments/results/h200-tp1-sync", "--gpu", "B300",
            "--out", tmp_path / "out")
    one_line_exit_2(r, "--gpu 'B300': unknown GPU (known: A100-SXM4-40GB")
    assert not (tmp_path / "out").exists()


def test_the_calibration_is_required(tmp_path):
    r = cli("simulate", "h200-tp1", "--out", tmp_path / "out")
    one_line_exit_2(r, "--calibration: required (or a config with engine.kind sim and engine.calibration)")


def test_a_default_engine_calibration_without_gpu_spans(tmp_path):
    """h200-tp1-async ran vLLM's default engine with host stamps only: no step's own cost to fit."""
    r = cli("simulate", "h200-tp1", "--calibration", "experiments/results/h200-tp1-async", "--out", tmp_path / "out")
    one_line_exit_2(r, "--calibration experiments/results/h200-tp1-async: it ran vLLM's async scheduling, but its "
                       "steps are not all timed on the GPU with host stamps beside them (timing engine-async); "
                       "no per-step cost to fit")
    assert not (tmp_path / "out").exists()
