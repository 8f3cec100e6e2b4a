"""The one backend registry (prefixstudy.engines.BACKENDS) and switching kinds from the command line."""

from __future__ import annotations

import os
import subprocess
import sys
import typing
from pathlib import Path

import pytest

from prefixstudy.config import ENGINE_KINDS, StudyConfig, load_config
from prefixstudy.configs import resolve_config
from prefixstudy.engines import BACKENDS, config_classes, engine_class
from prefixstudy.errors import UserError

REPO = Path(__file__).resolve().parents[2]


def test_the_config_union_is_the_registry():
    assert ENGINE_KINDS == tuple(BACKENDS) == ("vllm", "echo", "http", "vllm-server", "sglang-server", "sim")
    union = typing.get_args(StudyConfig.model_fields["engine"].annotation)
    assert union == tuple(config_classes().values())
    for kind, cls in config_classes().items():
        assert cls.model_fields["kind"].default == kind  # the discriminator names its own row
        assert engine_class(kind).kind == kind
        assert type(load_config(None, {"engine": {"kind": kind, **({"calibration": "x"} if kind == "sim" else {})}})
                    .engine) is cls


def test_set_kind_over_the_shipped_default_drops_the_keys_the_new_kind_lacks():
    cfg = load_config(resolve_config(None), {"engine.kind": "echo"})
    assert cfg.engine.kind == "echo"
    assert cfg.engine.max_model_len == 2048  # a field both kinds have stays the file's
    assert cfg.engine.block_size == 16  # echo's own default


def test_set_kind_over_the_user_s_file_names_the_flag_and_the_key(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("engine:\n  max_model_len: 1024\n  dtype: float32\n")
    with pytest.raises(UserError) as e:
        load_config(p, {"engine.kind": "echo"})
    assert str(e.value) == (f"--set engine.kind=echo: {p} sets field 'engine.dtype', which engine.kind echo has no "
                            f"field for; remove it from the file, or set engine.kind: echo there")
    p.write_text("engine:\n  max_model_len: 1024\n")
    assert load_config(p, {"engine.kind": "echo"}).engine.max_model_len == 1024


def test_a_key_given_with_the_kind_on_the_command_line_is_checked_as_usual():
    with pytest.raises(UserError, match=r"^--set engine.dtype: field 'engine.dtype': unknown key$"):
        load_config(resolve_config(None), {"engine.kind": "echo", "engine.dtype": "float32"})


@pytest.mark.slow
def test_the_cli_dry_run_switches_to_echo():
    r = subprocess.run([sys.executable, "-m", "prefixstudy", "run", "--set", "engine.kind=echo", "--executor", "local",
                        "--dry-run"], cwd=REPO, env=dict(os.environ), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == ("ok: study default, 30 dataset rows, modes on,off, rates 2,4,8,16 req/s, executor local; "
                                "nothing run (--dry-run)")
