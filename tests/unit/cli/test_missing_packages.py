"""Optional parts missing: one line naming the field and the extra, exit 2, before any results
folder exists, and `--dry-run` says the same.  And a plain install (no vLLM, Ray or torch)
measures a server over HTTP.

Each case runs the real CLI in a subprocess with the packages hidden (``sys.modules[name] = None``
makes ``import name`` fail, and ``find_spec`` say it is not there), as a venv without them would.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
HIDE = ("import sys\n"
        "for m in sys.argv[1].split(','):\n"
        "    if m: sys.modules[m] = None\n"
        "sys.argv = ['prefixstudy'] + sys.argv[2:]\n"
        "from prefixstudy.cli import entrypoint\n"
        "entrypoint()\n")


def cli(hidden: str, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", HIDE, hidden, *map(str, args)], cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=180)


def echo_config(tmp: Path, **top) -> Path:
    p = tmp / "echo.yaml"
    p.write_text(yaml.safe_dump({
        "study": "miss", "out": str(tmp / "res"), "engine": {"kind": "echo"},
        "dataset": {"num_requests": 4, "prefix_len": 32, "suffix_len": 4, "output_len": 2},
        "sweep": {"rates": [50], "num_requests": 4, "warmup_requests": 0}, **top}))
    return p


def sim_config(tmp: Path) -> Path:
    p = tmp / "sim.yaml"
    p.write_text(yaml.safe_dump({
        "study": "miss", "out": str(tmp / "res"), "model": str(REPO / "prefixstudy/configs/models/tiny-llama"),
        "engine": {"kind": "sim", "calibration": str(tmp / "nowhere"), "block_size": 16},
        "dataset": {"prefix_len": 48, "suffix_len": 16, "output_len": 4},
        "sweep": {"rates": [1], "num_requests": 3, "warmup_requests": 0}}))
    return p


RAY = "field 'executor': ray is not installed here (pip install 'prefixstudy[ray]'); or --executor local"
VLLM = ("needs vLLM, which is not installed here (pip install 'prefixstudy[cpu]' or 'prefixstudy[gpu]'); "
        "a running server is measured without it (engine.kind http)")


@pytest.mark.parametrize("dry", [False, True], ids=["run", "dry-run"])
@pytest.mark.parametrize("hidden, args, line", [
    ("ray", lambda t: ["run", echo_config(t), "--executor", "ray"], RAY),
    ("ray", lambda t: ["run", echo_config(t), "--ray-address", "auto"],
     "field 'ray.address': auto names a Ray cluster, but ray is not installed here (pip install 'prefixstudy[ray]')"),
    ("vllm", lambda t: ["run", "default", "--out", t / "res"], f"field 'engine.kind': vllm {VLLM}"),
    ("vllm", lambda t: ["run", sim_config(t)], f"field 'engine.kind': sim {VLLM}"),
    ("torch", lambda t: ["run", "h200-tp1", "--out", t / "res", "--executor", "local"],
     "field 'device': cuda needs torch, which is not installed here (pip install 'prefixstudy[gpu]')"),
], ids=["executor-ray", "ray-address-auto", "vllm", "sim", "gpu-without-torch"])
def test_a_missing_package_is_one_line_before_any_results_folder(tmp_path, hidden, args, line, dry):
    r = cli(hidden, *args(tmp_path), *(["--dry-run"] if dry else []))
    assert (r.returncode, r.stdout, r.stderr) == (2, "", f"error: {line}\n")
    assert not (tmp_path / "res").exists()


def test_simulate_without_vllm_is_one_line_and_leaves_no_folder(tmp_path):
    r = cli("vllm", "simulate", echo_config(tmp_path), "--calibration", tmp_path / "nowhere")
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr == ("error: prefixstudy simulate: the simulator replays vLLM's own scheduler, so it "
                        f"{VLLM}\n")
    assert not (tmp_path / "res").exists()


def test_a_gpu_config_checked_on_a_cpu_machine_says_it_cannot_run_here(tmp_path):
    r = cli("", "run", "h200-tp1", "--dry-run", "--executor", "local")
    assert r.returncode == 0, r.stderr
    ok, note = r.stdout.splitlines()
    assert ok.startswith("ok: study h200-tp1, 720 dataset rows") and ok.endswith("executor local; nothing run (--dry-run)")
    assert note == "note: it cannot run on this machine: field 'device': cuda asked for, but torch sees no CUDA GPU here"
    r = cli("", "run", "h200-tp1", "--out", tmp_path / "res", "--executor", "local")
    assert (r.returncode, r.stderr) == (2, "error: field 'device': cuda asked for, but torch sees no CUDA GPU here\n")
    assert not (tmp_path / "res").exists()


def test_an_in_process_stand_in_runs_locally_by_default(tmp_path):
    r = cli("", "run", echo_config(tmp_path), "--dry-run")
    assert r.stdout == "ok: study miss, 4 dataset rows, modes on,off, rates 50 req/s, executor local; nothing run (--dry-run)\n"


def test_a_plain_install_measures_a_server_over_http(tmp_path):
    from tests.unit.cli.test_failing_server import stub

    server = stub("good")
    url = f"http://127.0.0.1:{server.server_address[1]}"
    cfg = tmp_path / "http.yaml"
    cfg.write_text(yaml.safe_dump({
        "study": "plain", "out": str(tmp_path / "res"),
        "engine": {"kind": "http", "targets": {"on": url, "off": url}, "block_size": 16, "metrics_path": None},
        "dataset": {"num_requests": 4, "prefix_len": 32, "suffix_len": 4, "output_len": 4},
        "sweep": {"rates": [20], "num_requests": 4, "warmup_requests": 0}}))
    try:
        r = cli("vllm,ray,torch", "run", cfg, "--quiet", "--no-report")
    finally:
        server.shutdown()
        server.server_close()
    assert r.returncode == 0, r.stderr
    (d,) = (tmp_path / "res" / "plain").iterdir()
    m = json.loads((d / "manifest.json").read_text())
    assert (m["status"], m["executor"], [p["status"] for p in m["points"]]) == ("complete", "local", ["ok", "ok"])
