"""Config input found bad before anything is generated or started: a file that is empty, reads
without end, names a key twice, or expands through YAML aliases; seeds numpy cannot take; a
duration that is not finite; and sizes whose dataset could not fit in memory.  Each is one line
naming the file and, where there is one, the field (the CLI turns it into exit 2; the subprocess
corpus in tests/unit/cli/test_bad_input.py checks that path for a few of them).  And one good
input: a config path given from Python as a str, which loads as its Path does."""

from __future__ import annotations

import pytest
import yaml

from prefixstudy.config import CONFIG_MAX_VALUES, DATASET_MAX_TOKENS, load_config
from prefixstudy.errors import UserError

ECHO = {"engine": {"kind": "echo"}, "executor": "local"}


def write(tmp_path, text: str, name: str = "c.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return p


def refused(path, overrides=None) -> str:
    with pytest.raises(UserError) as e:
        load_config(path, overrides)
    msg = str(e.value)
    assert "\n" not in msg
    return msg


@pytest.mark.parametrize("text", ["", "# only a comment\n", "\n\n---\n"])
def test_an_empty_config_is_refused_not_run_as_the_default_study(tmp_path, text):
    p = write(tmp_path, text)
    assert refused(p) == (f"{p}: no config keys (the file is empty or only comments); "
                          "run without a config for the default study")


def test_a_key_given_twice_is_refused_naming_its_line(tmp_path):
    p = write(tmp_path, "study: a\nsweep:\n  rates: [1]\n  rates: [2]\n")
    assert refused(p) == f"{p}: line 4: invalid YAML: key 'rates' is given twice"
    # The same key in two different mappings is fine.
    assert load_config(write(tmp_path, yaml.safe_dump({**ECHO, "study": "a", "dataset": {"seed": 1},
                                                       "arrivals": {"seed": 1}}), "ok.yaml")).dataset.seed == 1


def test_an_alias_bomb_is_refused_before_it_is_expanded(tmp_path):
    lines = ["a0: &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 6)]  # 10^6 values
    p = write(tmp_path, "\n".join(lines) + "\n")
    assert refused(p) == f"{p}: expands to more than {CONFIG_MAX_VALUES:,} values (YAML aliases?); a config is a few dozen"


@pytest.mark.slow
def test_yaml_nested_past_the_parser_s_depth_is_one_line(tmp_path):
    p = write(tmp_path, "[" * 6000 + "]" * 6000 + "\n")
    assert refused(p) == f"{p}: invalid YAML: nested too deep for a config"


def test_a_config_that_reads_without_end_or_cannot_be_read_is_one_line(tmp_path):
    assert refused("/dev/zero") == "/dev/zero: a device, not a file; expected a YAML config file"
    big = write(tmp_path, "study: a\n" + "#" * (1 << 20) + "\n", "big.yaml")
    assert refused(big) == f"{big}: larger than 1 MiB, expected a YAML config file"
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.symlink_to(b)
    b.symlink_to(a)
    assert refused(a) == f"{a}: cannot read (Too many levels of symbolic links)"


@pytest.mark.parametrize("field, value, msg", [
    ("dataset.seed", -1, "Input should be greater than or equal to 0"),
    ("arrivals.seed", -1, "Input should be greater than or equal to 0"),
    ("sweep.min_duration_s", float("inf"), "Input should be a finite number"),
    ("sweep.repeats", 10**10, "Input should be less than or equal to 1000"),
    ("replicas", 10**6, "Input should be less than or equal to 1024"),
])
def test_values_numpy_or_the_sweep_cannot_take_are_refused(field, value, msg):
    assert refused(None, {**ECHO, field: value}) == f"--set {field}: field '{field}': {msg}"


@pytest.mark.parametrize("overrides, rows, prompt, groups", [
    ({"dataset.prefix_len": 10**9}, 42, 10**9 + 16, None),
    ({"sweep.num_requests": 10**12}, 10**12 + 2, 1214, None),
    ({"sweep.warmup_requests": 10**9}, 10**9 + 40, 1214, None),
    ({"sweep.rates": [10**6], "sweep.min_duration_s": 10**4}, 10**10 + 2, 1214, None),
    ({"dataset.kind": "groups", "dataset.groups": 10**9}, 42, 1214, 10**9),
])
def test_a_dataset_too_large_for_memory_is_refused_before_it_is_generated(overrides, rows, prompt, groups):
    tokens = rows * prompt + (groups * 1198 if groups else 0)
    assert tokens > DATASET_MAX_TOKENS
    assert refused(None, {**ECHO, **overrides}) == (
        f"(defaults): field 'dataset': the generated dataset would hold {tokens:.3g} prompt tokens "
        f"({rows:,} rows of {prompt:,} tokens" + (f", {groups:,} group prefixes" if groups else "")
        + f"), more than {DATASET_MAX_TOKENS:.3g}; lower the request count, the prompt length or the number of groups")


def test_the_largest_shipped_configs_pass_the_size_check():
    from prefixstudy.configs import shipped_config

    for name in ("default", "h200-tp1", "h200-cache-pressure", "h200-offload", "h200-multiturn"):
        load_config(shipped_config(name))


def _rows(cfg):
    from prefixstudy.workloads import load_rows

    return load_rows(cfg)


def test_a_dataset_or_model_file_nested_too_deep_or_looping_is_one_line(tmp_path):
    deep = tmp_path / "deep.jsonl"
    deep.write_text('{"a": ' * 6000 + "1" + "}" * 6000 + "\n")
    with pytest.raises(UserError, match=rf"^{deep}:1: malformed JSON \(nested too deep\)$"):
        _rows(load_config(None, {**ECHO, "dataset.path": str(deep)}))
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.symlink_to(b)
    b.symlink_to(a)
    with pytest.raises(UserError, match=rf"^{a}: cannot read \(Too many levels of symbolic links\)$"):
        _rows(load_config(None, {**ECHO, "dataset.path": str(a)}))
    with pytest.raises(UserError, match=r"^/dev/zero: a device, not a file; expected a dataset file$"):
        _rows(load_config(None, {**ECHO, "dataset.path": "/dev/zero"}))
    looped = tmp_path / "looped"
    looped.mkdir()
    (looped / "config.json").symlink_to(looped / "config.json")
    with pytest.raises(UserError, match=rf"^{looped / 'config.json'}: cannot read \(Too many levels of symbolic links\)$"):
        _rows(load_config(None, {**ECHO, "model": str(looped)}))
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("[" * 6000 + "]" * 6000)
    with pytest.raises(UserError, match=rf"^{model / 'config.json'}: not valid JSON \(nested too deep\)$"):
        _rows(load_config(None, {**ECHO, "model": str(model)}))


def test_a_config_path_given_as_a_string_loads_as_its_path(tmp_path):
    # From Python a path is often a str; the dataset beside the file resolves against its folder all the same.
    (tmp_path / "prompts.jsonl").write_text('{"prompt_token_ids": [1, 2, 3], "output_len": 2}\n')
    p = write(tmp_path, "engine:\n  kind: echo\nexecutor: local\ndataset:\n  kind: jsonl\n  path: prompts.jsonl\n")
    cfg = load_config(str(p))
    assert cfg.dataset.path == (tmp_path / "prompts.jsonl").resolve()
    assert cfg.model_dump() == load_config(p).model_dump()
