"""The shipped configs (prefixstudy.configs) and ``prefixstudy init``: found by name from any
directory, copied to start from, never overwritten.  Through the real CLI, in a subprocess whose
cwd is outside the repo, as a user who installed the package would run it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from prefixstudy.config import load_config, resolve_model_path
from prefixstudy.configs import resolve_config, shipped_config, shipped_configs, shipped_model_dir
from prefixstudy.errors import UserError
from tests import forkcli

SHIPPED = ["cpu-shared-fraction", "default", "h200-cache-pressure", "h200-multiturn", "h200-offload", "h200-replicas",
           "h200-sglang", "h200-tp1",
           "h200-tp1-sync", "h200-tp2", "seed-a100x8-tp8", "seed-h200x8-tp4-parallel", "seed-h200x8-tp8", "try-echo"]


def cli(cwd: Path, *args) -> subprocess.CompletedProcess:
    return forkcli.run(args, cwd=cwd, timeout=120)


def test_shipped_names():
    assert shipped_configs() == SHIPPED
    assert shipped_config("h200-tp1") == shipped_config("h200-tp1.yaml")
    assert shipped_config("h200-tp1").parent == shipped_config("default").parent
    assert shipped_config("nope") is None and shipped_config("../default") is None
    assert (shipped_model_dir("tiny-llama") / "config.json").is_file()
    assert (shipped_model_dir("mistral-7b-v0.3") / "config.json").is_file()
    assert shipped_model_dir("nope") is None


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_config_loads_with_its_shipped_model(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # nothing to find in the cwd: the model comes from the package
    cfg = load_config(resolve_config(name))
    assert Path(cfg.model) == shipped_model_dir(cfg.model.rsplit("/", 1)[-1])
    assert cfg.model_config_json()["vocab_size"] > 0


def test_resolve_config(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert resolve_config(None) == shipped_config("default")
    assert resolve_config("h200-tp1") == shipped_config("h200-tp1")
    (tmp_path / "h200-tp1").write_text("study: mine\n")  # an existing file wins over a shipped name
    assert resolve_config("h200-tp1") == Path("h200-tp1")
    assert resolve_config("sub/nope.yaml") == Path("sub/nope.yaml")  # a path: the reader says "not found"
    with pytest.raises(UserError, match=r"^'nope' is not a config file nor a shipped config; shipped: "
                                        r"cpu-shared-fraction, default, "):
        resolve_config("nope")


def test_model_path_order(tmp_path, monkeypatch):
    """cwd, then the config's folder, then the shipped models; a hub id passes through."""
    monkeypatch.chdir(tmp_path)
    assert resolve_model_path("tiny-llama") == str(shipped_model_dir("tiny-llama").resolve())
    (tmp_path / "cfgdir" / "tiny-llama").mkdir(parents=True)
    assert resolve_model_path("tiny-llama", tmp_path / "cfgdir") == str(tmp_path / "cfgdir" / "tiny-llama")
    (tmp_path / "tiny-llama").mkdir()
    assert resolve_model_path("tiny-llama", tmp_path / "cfgdir") == str(tmp_path / "tiny-llama")
    assert resolve_model_path("mistralai/Mistral-7B-v0.3") == "mistralai/Mistral-7B-v0.3"


@pytest.mark.slow
def test_run_by_name_from_anywhere(tmp_path):
    r = cli(tmp_path, "run", "--dry-run")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("ok: study default, 30 dataset rows, modes on,off, rates 2,4,8,16 req/s, executor ")
    r = cli(tmp_path, "run", "h200-tp1", "--dry-run")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("ok: study h200-tp1, 1440 dataset rows, modes on,off, rates 1,16,32,56,96 "
                               "req/s x 3 repeats")


def test_run_unknown_name_is_one_line(tmp_path):
    r = cli(tmp_path, "run", "nope")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr == ("error: 'nope' is not a config file nor a shipped config; shipped: "
                        f"{', '.join(SHIPPED)}\n")


def test_init_writes_a_runnable_copy(tmp_path):
    r = cli(tmp_path, "init", "study")
    assert r.returncode == 0, r.stderr
    dest = tmp_path / "study" / "prefixstudy.yaml"
    assert r.stdout == "wrote study/prefixstudy.yaml (the shipped 'default')\n" \
                       "next: prefixstudy run study/prefixstudy.yaml --dry-run\n"
    assert dest.read_text().endswith(shipped_config("default").read_text())
    r = cli(tmp_path, "run", dest, "--dry-run")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("ok: study default, 30 dataset rows")


def test_init_from_a_shipped_name(tmp_path):
    r = cli(tmp_path, "init", tmp_path, "--from", "h200-tp2")
    assert r.returncode == 0, r.stderr
    assert "model: mistral-7b-v0.3" in (tmp_path / "prefixstudy.yaml").read_text()
    assert load_config(tmp_path / "prefixstudy.yaml").engine.tensor_parallel_size == 2


def test_init_never_overwrites(tmp_path):
    (tmp_path / "prefixstudy.yaml").write_text("study: mine\n")
    r = cli(tmp_path, "init", ".")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr == "error: prefixstudy.yaml: already exists; not overwriting it " \
                       "(remove it or pick another folder)\n"
    assert (tmp_path / "prefixstudy.yaml").read_text() == "study: mine\n"


def test_init_unknown_name(tmp_path):
    r = cli(tmp_path, "init", "x", "--from", "nope")
    assert r.returncode == 2
    assert r.stderr == f"error: --from nope: not a shipped config; shipped: {', '.join(SHIPPED)}\n"
    assert not (tmp_path / "x").exists()


def test_recorded_results_find_the_moved_model_folders():
    """Studies recorded before the move name /.../experiments/models/<name>; they still load."""
    import yaml

    from prefixstudy.config import parse_config

    repo = Path(__file__).resolve().parents[3]
    recorded = yaml.safe_load((repo / "experiments/results/h200-tp1-gc/config.yaml").read_text())
    assert recorded["model"].endswith("experiments/models/mistral-7b-v0.3")
    cfg = parse_config(recorded, "config.yaml")
    assert cfg.model == str(shipped_model_dir("mistral-7b-v0.3").resolve())
    assert parse_config({"model": "/gone/experiments/models/nope"}, "x").model == "/gone/experiments/models/nope"
