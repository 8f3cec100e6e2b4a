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


def test_a_default_engine_calibration_without_gpu_spans_is_fitted_to_its_timestamps(monkeypatch, caplog):
    """h200-tp1-async ran vLLM's default engine with host stamps only: no step's own cost to fit, so
    its request timestamps are fitted instead, and the warning says why."""
    from prefixstudy.study import simulate as sim_run
    from prefixstudy.sim.fit_requests import has_step_records, why_no_step_fit

    calibration = REPO / "experiments/results/h200-tp1-async"
    assert not has_step_records(calibration)
    assert why_no_step_fit(calibration) == "has no step records that time a step's own cost (timing engine-async)"
    assert why_no_step_fit(REPO / "experiments/results/h200-vllm-server") == "has no step records"
    fitted = []
    monkeypatch.setattr(sim_run, "fit_timestamps", lambda cfg, rows, target, req, summary, source, **kw: fitted.append(
        (target.block_size, len(req), len(summary), source, kw)) or "cost")
    _, arch, gpu, block_size, _ = sim_run.calibration_source(calibration)
    with caplog.at_level("WARNING", logger="prefixstudy"):
        assert sim_run.calibration_cost(calibration, arch, gpu, 1, block_size) == "cost"
    # every request of its 4 points x 2 repeats; the fit's count on a terminal only (tqdm's disable=None)
    assert fitted == [(16, 1056, 8, str(calibration), {"bar": None})]
    assert f"{calibration} has no step records that time a step's own cost (timing engine-async): fitting the step " \
           "cost to its request timestamps (up to 200 simulations of its points)" in caplog.text


