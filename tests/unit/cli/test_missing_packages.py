"""Optional parts missing: one line naming the field and the extra, exit 2, before any results
folder exists, and `--dry-run` says the same.  And a plain install (no vLLM, Ray or torch)
measures a server over HTTP.

The cases run the wheel in a venv of its own that holds the base dependencies and nothing else
(``base_venv``: the distributions pyproject's dependencies pull in, resolved from this venv's
metadata and linked in; nothing is downloaded), so vLLM, Ray and torch are absent as on a plain
`pip install prefixstudy`.  The one case a real install cannot have, vLLM without torch, hides
torch from the test venv instead (``sys.modules[name] = None`` makes ``import name`` fail).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from tests.wheelvenv import wheel_venv

# Its module fixtures take seconds (studies, reports, venvs): the whole file runs in `make test`, not `make test-fast`.
pytestmark = pytest.mark.slow

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


def _base_closure() -> dict:
    """The distributions of pyproject's dependencies and theirs, without extras."""
    import importlib.metadata as md
    import tomllib

    from packaging.requirements import Requirement

    todo = [Requirement(d) for d in tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]]
    seen: dict = {}
    while todo:
        req = todo.pop()
        key = req.name.lower().replace("_", "-")
        if key not in seen:
            seen[key] = md.distribution(req.name)
            todo += [r for r in map(Requirement, seen[key].requires or [])
                     if r.marker is None or r.marker.evaluate({"extra": ""})]
    return seen


@pytest.fixture(scope="module")
def base_venv(tmp_path_factory) -> SimpleNamespace:
    """The wheel in a fresh venv (tests/wheelvenv.py) that sees only the base dependencies: each
    base distribution's top-level files, linked from this venv into one folder."""
    tmp = tmp_path_factory.mktemp("base-venv")
    deps = tmp / "deps"
    deps.mkdir()
    for dist in _base_closure().values():
        for top in {f.parts[0] for f in dist.files or [] if f.parts[0] not in ("..", "__pycache__")}:
            if not (deps / top).exists() and not top.endswith(".pth"):
                (deps / top).symlink_to(dist.locate_file(top))
    return wheel_venv(tmp, [deps])


def plain(venv: SimpleNamespace, *args) -> subprocess.CompletedProcess:
    """`python -m prefixstudy ARGS` in the base venv."""
    return subprocess.run([str(venv.py), "-m", "prefixstudy", *map(str, args)], cwd=venv.cwd, env=venv.env,
                          capture_output=True, text=True, timeout=180)


def test_the_base_venv_has_no_vllm_ray_or_torch_and_runs_the_wheel(base_venv):
    r = subprocess.run([str(base_venv.py), "-c", "import importlib.util as u, prefixstudy; "
                        "print([u.find_spec(m) is None for m in ('vllm', 'ray', 'torch')], prefixstudy.__file__)"],
                       cwd=base_venv.cwd, env=base_venv.env, capture_output=True, text=True, check=True)
    missing, where = r.stdout.split("] ")
    assert missing == "[True, True, True"
    assert Path(where.strip()).is_relative_to(base_venv.py.parents[1])


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
@pytest.mark.parametrize("args, line", [
    (lambda t: ["run", echo_config(t), "--executor", "ray"], RAY),
    (lambda t: ["run", echo_config(t), "--ray-address", "auto"],
     "field 'ray.address': auto names a Ray cluster, but ray is not installed here (pip install 'prefixstudy[ray]')"),
    (lambda t: ["run", "default", "--out", t / "res"], f"field 'engine.kind': vllm {VLLM}"),
    (lambda t: ["run", sim_config(t)], f"field 'engine.kind': sim {VLLM}"),
], ids=["executor-ray", "ray-address-auto", "vllm", "sim"])
def test_a_missing_package_is_one_line_before_any_results_folder(base_venv, tmp_path, args, line, dry):
    r = plain(base_venv, *args(tmp_path), *(["--dry-run"] if dry else []))
    assert (r.returncode, r.stdout, r.stderr) == (2, "", f"error: {line}\n")
    assert not (tmp_path / "res").exists()


@pytest.mark.parametrize("dry", [False, True], ids=["run", "dry-run"])
def test_a_gpu_config_without_torch_is_one_line(tmp_path, dry):
    r = cli("torch", "run", "h200-tp1", "--out", tmp_path / "res", "--executor", "local", *(["--dry-run"] if dry else []))
    assert (r.returncode, r.stdout, r.stderr) == \
        (2, "", "error: field 'device': cuda needs torch, which is not installed here (pip install 'prefixstudy[gpu]')\n")
    assert not (tmp_path / "res").exists()


def test_simulate_without_vllm_is_one_line_and_leaves_no_folder(base_venv, tmp_path):
    r = plain(base_venv, "simulate", echo_config(tmp_path), "--calibration", tmp_path / "nowhere")
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr == ("error: prefixstudy simulate: the simulator replays vLLM's own scheduler, so it "
                        f"{VLLM}\n")
    assert not (tmp_path / "res").exists()


def test_a_gpu_config_checked_on_a_cpu_machine_says_it_cannot_run_here(tmp_path):
    r = cli("", "run", "h200-tp1", "--dry-run", "--executor", "local")
    assert r.returncode == 0, r.stderr
    ok, note = r.stdout.splitlines()
    assert ok.startswith("ok: study h200-tp1, 1440 dataset rows") and ok.endswith("executor local; nothing run (--dry-run)")
    assert note == "note: cannot run here: field 'device': cuda asked for, but torch sees no CUDA GPU here"
    r = cli("", "run", "h200-tp1", "--out", tmp_path / "res", "--executor", "local")
    assert (r.returncode, r.stderr) == (2, "error: field 'device': cuda asked for, but torch sees no CUDA GPU here\n")
    assert not (tmp_path / "res").exists()


def test_an_in_process_stand_in_runs_locally_by_default(tmp_path):
    r = cli("", "run", echo_config(tmp_path), "--dry-run")
    assert r.stdout == "ok: study miss, 4 dataset rows, modes on,off, rates 50 req/s, executor local; nothing run (--dry-run)\n"


def test_a_plain_install_measures_a_server_over_http(base_venv, tmp_path):
    from tests.unit.cli.test_failing_server import stub

    with stub("good") as server:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        cfg = tmp_path / "http.yaml"
        cfg.write_text(yaml.safe_dump({
            "study": "plain", "out": str(tmp_path / "res"),
            "engine": {"kind": "http", "targets": {"on": url, "off": url}, "block_size": 16, "metrics_path": None},
            "dataset": {"num_requests": 4, "prefix_len": 32, "suffix_len": 4, "output_len": 4},
            "sweep": {"rates": [20], "num_requests": 4, "warmup_requests": 0}}))
        r = plain(base_venv, "run", cfg, "--quiet", "--no-report")
    assert r.returncode == 0, r.stderr
    (d,) = (tmp_path / "res" / "plain").iterdir()
    m = json.loads((d / "manifest.json").read_text())
    assert (m["status"], m["executor"], [p["status"] for p in m["points"]]) == ("complete", "local", ["ok", "ok"])
