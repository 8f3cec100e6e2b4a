"""Bad input: a malformed config, dataset or flag is one line on stderr naming the file,
line or field; exit code 2; no traceback; no results folder.

Every case drives the real CLI in a process of its own (a forked child of a pre-imported server,
tests/forkcli.py), so a traceback that reached the user would show.
Each case writes its inputs into ``tmp_path``; none starts an engine (they fail before vLLM loads,
except the unknown engine argument, which has to import vLLM to know its arguments).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from tests import forkcli

REPO = Path(__file__).resolve().parents[3]
TINY = REPO / "prefixstudy/configs/models/tiny-llama"
MISTRAL = REPO / "prefixstudy/configs/models/mistral-7b-v0.3"
GOOD_ROW = {"request_id": "a", "prompt_token_ids": [1, 2, 3], "output_len": 4}


def cli(*args, timeout: float = 600) -> subprocess.CompletedProcess:
    # The timeout only stops a hung run: the case that imports vLLM took over 120 s on two cores
    # shared with five other test runs (load average 10).
    # env is an explicit copy: without one, the vfork()ed child execs with the live ``environ``, and
    # a thread left by an earlier in-process engine that calls setenv() meanwhile frees that array
    # (a CI run failed one case with "OSError: [Errno 14] Bad address" from the exec).
    return forkcli.run(args, cwd=REPO, env=dict(os.environ), timeout=timeout)


def _merge(base: dict, patch: dict) -> dict:
    out = dict(base)
    for k, v in patch.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def base_config() -> dict:
    """Valid on its own: every case breaks exactly one thing."""
    return {
        "study": "bad",
        "model": str(TINY),
        "executor": "local",
        "engine": {"dtype": "float32", "max_model_len": 2048, "gpu_memory_utilization": 0.1},
        "dataset": {"num_requests": 4, "prefix_len": 32, "suffix_len": 4, "output_len": 8},
        "sweep": {"rates": [1.0], "num_requests": 4, "warmup_requests": 0},
    }


def config(tmp: Path, patch: dict | None = None, name: str = "c.yaml") -> Path:
    p = tmp / name
    p.write_text(yaml.safe_dump(_merge(base_config(), patch or {}), sort_keys=False))
    return p


def raw(tmp: Path, name: str, content: str | bytes) -> Path:
    p = tmp / name
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(content if isinstance(content, bytes) else content.encode())
    return p


def jsonl(tmp: Path, rows: list, name: str = "d.jsonl") -> Path:
    return raw(tmp, name, "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))


def model_dir(tmp: Path, config_json: str | bytes | None) -> Path:
    d = tmp / "model"
    d.mkdir()
    if config_json is not None:
        raw(d, "config.json", config_json)
    return d


def simulate_model(tmp: Path, fields: dict) -> list:
    """``prefixstudy simulate`` of Mistral-7B's config.json with ``fields`` added, on h200-tp1."""
    mistral = json.loads((MISTRAL / "config.json").read_text())
    d = model_dir(tmp, json.dumps({**mistral, **fields}))
    return ["simulate", config(tmp, {"model": str(d)}), "--calibration", REPO / "experiments/results/h200-tp1-sync",
            "--out", tmp / "res", "--no-report"]


def run_cfg(tmp: Path, patch: dict | None = None, *flags) -> list:
    return ["run", config(tmp, patch), "--out", tmp / "res", *flags]


def run_dataset(tmp: Path, rows: list, *, name: str = "d.jsonl") -> list:
    return run_cfg(tmp, {"dataset": {"path": str(jsonl(tmp, rows, name))}})


def trt_jsonl(tmp: Path, rows: list) -> list:
    return ["dataset", "import", jsonl(tmp, rows, "t.jsonl"), tmp / "out.jsonl", "--format", "trtllm"]


def trt_json(tmp: Path, samples, text: str | None = None) -> list:
    doc = {"metadata": {"workload_type": "token-norm-dist", "num_requests": 2}, "samples": samples}
    src = raw(tmp, "t.json", text if text is not None else json.dumps(doc, indent=2))
    return ["dataset", "import", src, tmp / "out.jsonl", "--format", "trtllm"]


def recorded_run(tmp: Path) -> Path:
    """A results folder as `prefixstudy run` leaves it after an interruption, written by hand."""
    run = tmp / "runs" / "bad" / "20250101-000000"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump(base_config(), sort_keys=False))
    (run / "manifest.json").write_text(json.dumps({"study": "bad", "status": "interrupted", "points": []}))
    return run


# id -> (builder(tmp) -> CLI args, text the one stderr line must contain)
CASES = {
    # --- config files ---
    "config-not-found": (lambda t: ["run", t / "nope.yaml", "--out", t / "res"], "nope.yaml: config file not found"),
    "config-is-directory": (lambda t: ["run", t, "--out", t / "res"], ": is a directory, expected a YAML config"),
    "config-yaml-syntax-error": (
        lambda t: ["run", raw(t, "c.yaml", "study: a\nsweep:\n  rates: [1, 2\n  modes: [on]\n"), "--out", t / "res"],
        "c.yaml: line 4: invalid YAML"),
    "config-yaml-bad-indent": (
        lambda t: ["run", raw(t, "c.yaml", "study: a\n  model: x\n"), "--out", t / "res"],
        "c.yaml: line 2: invalid YAML"),
    "config-is-a-list": (lambda t: ["run", raw(t, "c.yaml", "- study: a\n- rates: [1]\n"), "--out", t / "res"],
                         "c.yaml: expected a mapping of config keys, got list"),
    "config-is-a-scalar": (lambda t: ["run", raw(t, "c.yaml", "just text\n"), "--out", t / "res"],
                           "c.yaml: expected a mapping of config keys, got str"),
    "config-not-utf8": (lambda t: ["run", raw(t, "c.yaml", b"study: caf\xe9\n"), "--out", t / "res"],
                        "c.yaml: not UTF-8 text (byte 10)"),
    "config-empty": (lambda t: ["run", raw(t, "c.yaml", "# only a comment\n"), "--out", t / "res"],
                     "c.yaml: no config keys (the file is empty or only comments)"),
    "config-duplicate-key": (lambda t: ["run", raw(t, "c.yaml", "study: a\nstudy: b\n"), "--out", t / "res"],
                             "c.yaml: line 2: invalid YAML: key 'study' is given twice"),
    "dataset-too-large-for-memory": (lambda t: run_cfg(t, {"dataset": {"prefix_len": 10**9}}),
                                     "c.yaml: field 'dataset': the generated dataset would hold 4e+09 prompt tokens"),
    "unknown-top-level-key": (lambda t: run_cfg(t, {"bogus": 1}), "c.yaml: field 'bogus': unknown key"),
    "unknown-nested-key": (lambda t: run_cfg(t, {"sweep": {"ratez": [1]}}), "c.yaml: field 'sweep.ratez': unknown key"),
    "unknown-deep-section": (lambda t: run_cfg(t, {"nosuch": {"a": 1}}), "c.yaml: field 'nosuch': unknown key"),
    # --- replicas and routing ---
    "replicas-zero": (lambda t: run_cfg(t, {"replicas": 0}), "c.yaml: field 'replicas': Input should be greater than"),
    "router-unknown-policy": (lambda t: run_cfg(t, {"replicas": 2, "router": {"policies": ["random"]}}),
                              "c.yaml: field 'router.policies.0': Input should be 'round_robin'"),
    "router-unknown-key": (lambda t: run_cfg(t, {"router": {"policy": "round_robin"}}),
                           "c.yaml: field 'router.policy': unknown key"),
    "router-load-bound-below-one": (lambda t: run_cfg(t, {"replicas": 2, "router": {"load_bound": 0.5}}),
                                    "c.yaml: field 'router.load_bound': Input should be greater than or equal to 1"),
    "router-off-policy-not-run": (
        lambda t: run_cfg(t, {"replicas": 2, "router": {"policies": ["prefix_affinity"], "off_policies": ["round_robin"]}}),
        "c.yaml: field 'router': Value error, off_policies names round_robin, which is not one of policies"),
    "resume-sweep-without-config": (
        lambda t: ["run", "--resume", raw(t, "sweep/sweep.json", '{"axes": {}, "cells": []}').parent],
        "sweep: no config.yaml beside its sweep index, so there is no recorded config to resume with; resume each "
        "cell's run folder instead"),
    "router-policies-one-replica": (
        lambda t: run_cfg(t, {"router": {"policies": ["round_robin", "prefix_affinity"]}}),
        "field 'router.policies': comparing policies needs replicas > 1"),
    "replicas-with-http": (
        lambda t: ["run", raw(t, "c.yaml", yaml.safe_dump({**base_config(), "replicas": 2, "engine": {
            "kind": "http", "targets": {"on": "http://127.0.0.1:9", "off": "http://127.0.0.1:9"}}})), "--out", t / "res"],
        "field 'replicas': engine.kind http measures the servers it is given"),
    # --- cache isolation ---
    "cache-isolation-unknown": (lambda t: run_cfg(t, {"sweep": {"cache_isolation": "flush"}}),
                                "c.yaml: field 'sweep.cache_isolation': Input should be 'reset' or 'salt'"),
    "cache-salt-with-sglang": (
        lambda t: ["run", raw(t, "c.yaml", yaml.safe_dump({**base_config(), "sweep": {
            **base_config()["sweep"], "cache_isolation": "salt"}, "engine": {"kind": "http", "server": "sglang",
            "targets": {"on": "http://127.0.0.1:9", "off": "http://127.0.0.1:9"}}})), "--out", t / "res"],
        "field 'sweep.cache_isolation': engine.server sglang takes no per-request cache salt (vLLM's `cache_salt`); "
        "use reset"),
    "wrong-type-int": (lambda t: run_cfg(t, {"sweep": {"num_requests": "many"}}),
                       "c.yaml: field 'sweep.num_requests': Input should be a valid integer"),
    "wrong-type-fractional-int": (lambda t: run_cfg(t, {"engine": {"max_model_len": 20.5}}),
                                  "c.yaml: field 'engine.max_model_len'"),
    "wrong-type-list": (lambda t: run_cfg(t, {"sweep": {"rates": 5}}),
                        "c.yaml: field 'sweep.rates': Input should be a valid list"),
    "wrong-type-section": (lambda t: run_cfg(t, {"engine": 5}), "c.yaml: field 'engine'"),
    "rates-empty-list": (lambda t: run_cfg(t, {"sweep": {"rates": []}}), "c.yaml: field 'sweep.rates'"),
    "rate-zero-yaml": (lambda t: run_cfg(t, {"sweep": {"rates": [1, 0]}}), "c.yaml: field 'sweep.rates': Value error"),
    "rate-negative-yaml": (lambda t: run_cfg(t, {"sweep": {"rates": [-2]}}), "c.yaml: field 'sweep.rates'"),
    "rate-nan-yaml": (lambda t: run_cfg(t, {"sweep": {"rates": [float("nan")]}}), "c.yaml: field 'sweep.rates'"),
    "rate-not-a-number-yaml": (lambda t: run_cfg(t, {"sweep": {"rates": ["fast"]}}), "c.yaml: field 'sweep.rates.0'"),
    "mode-unknown-yaml": (lambda t: run_cfg(t, {"sweep": {"modes": ["on", "sideways"]}}),
                          "c.yaml: field 'sweep.modes': 'sideways' is not an arm (on, off)"),
    "study-name-with-slash": (lambda t: run_cfg(t, {"study": "a/b"}), "c.yaml: field 'study'"),
    "study-name-dotdot": (lambda t: run_cfg(t, {"study": ".."}), "c.yaml: field 'study'"),
    "gpu-memory-over-1": (lambda t: run_cfg(t, {"engine": {"gpu_memory_utilization": 1.5}}),
                          "c.yaml: field 'engine.gpu_memory_utilization'"),
    "arrival-process-unknown": (lambda t: run_cfg(t, {"arrivals": {"process": "weibull"}}),
                                "c.yaml: field 'arrivals.process'"),
    "config-prefix-and-suffix-zero": (lambda t: run_cfg(t, {"dataset": {"prefix_len": 0, "suffix_len": 0}}),
                             "c.yaml: field 'dataset': Value error, prefix_len + suffix_len must be > 0"),
    "token-low-above-high": (lambda t: run_cfg(t, {"dataset": {"token_low": 500, "token_high": 100}}),
                             "c.yaml: field 'dataset': Value error, token_low 500 must be < token_high 100"),
    "token-high-above-vocab": (lambda t: run_cfg(t, {"dataset": {"token_high": 40000}}),
                               "field 'dataset.token_high': 40000 > the model's vocab size 32768"),
    "generated-too-long": (lambda t: run_cfg(t, {"engine": {"max_model_len": 40}}),
                           "prompt 36 + output 8 = 44 tokens > engine.max_model_len 40"),
    # --- the model folder ---
    "model-folder-missing": (lambda t: run_cfg(t, {"model": str(t / "nope")}), "field 'model': folder"),
    "model-without-config-json": (lambda t: run_cfg(t, {"model": str(model_dir(t, None))}),
                                  "config.json: model config not found"),
    "model-config-invalid-json": (lambda t: run_cfg(t, {"model": str(model_dir(t, '{\n "vocab_size": 32768,\n}'))}),
                                  "config.json: line 3: not valid JSON"),
    "model-config-no-vocab-size": (lambda t: run_cfg(t, {"model": str(model_dir(t, '{"hidden_size": 8}'))}),
                                   "config.json: field 'vocab_size'"),
    "model-config-vocab-size-text": (lambda t: run_cfg(t, {"model": str(model_dir(t, '{"vocab_size": "big"}'))}),
                                     "config.json: field 'vocab_size'"),
    "model-config-not-utf8": (lambda t: run_cfg(t, {"model": str(model_dir(t, b'{"vocab_size": 8, "n": "\xff"}'))}),
                              "config.json: not UTF-8 text (byte 24)"),
    # --- a prefixstudy JSONL dataset named in the config (dataset.path) ---
    "dataset-not-found": (lambda t: run_cfg(t, {"dataset": {"path": str(t / "nope.jsonl")}}),
                          "nope.jsonl: dataset file not found"),
    "dataset-is-directory": (lambda t: run_cfg(t, {"dataset": {"path": str(t)}}),
                             ": is a directory, expected a dataset"),
    "dataset-empty-file": (lambda t: run_dataset(t, []), "d.jsonl: dataset is empty"),
    "dataset-blank-lines-only": (lambda t: run_cfg(t, {"dataset": {"path": str(raw(t, "d.jsonl", "\n  \n\t\n"))}}),
                                 "d.jsonl: dataset is empty"),
    "dataset-malformed-json": (lambda t: run_dataset(t, [GOOD_ROW, '{"prompt_token_ids": [1, 2'], ),
                               "d.jsonl:2: malformed JSON"),
    "dataset-line-not-object": (lambda t: run_dataset(t, ["[1, 2, 3]"]), "d.jsonl:1: expected a JSON object"),
    "dataset-not-utf8": (lambda t: run_cfg(t, {"dataset": {"path": str(raw(t, "d.jsonl", b'{"a": "\xc3\x28"}\n'))}}),
                         "d.jsonl: not UTF-8 text (byte 7)"),
    "dataset-token-at-vocab": (lambda t: run_dataset(t, [GOOD_ROW, {**GOOD_ROW, "request_id": "b",
                                                                    "prompt_token_ids": [5, 32768]}]),
                               "d.jsonl: request 2 ('b'): token id 32768 >= vocab size 32768"),
    "dataset-negative-token": (lambda t: run_dataset(t, [GOOD_ROW, {**GOOD_ROW, "request_id": "b",
                                                                    "prompt_token_ids": [5, -1]}]),
                               "d.jsonl:2: field 'prompt_token_ids': token ids must be integers >= 0, got -1"),
    "dataset-float-token": (lambda t: run_dataset(t, [{**GOOD_ROW, "prompt_token_ids": [5, 1.5]}]),
                            "d.jsonl:1: field 'prompt_token_ids': token ids must be integers >= 0, got 1.5"),
    "dataset-string-token": (lambda t: run_dataset(t, [{**GOOD_ROW, "prompt_token_ids": ["7"]}]),
                             "d.jsonl:1: field 'prompt_token_ids'"),
    "dataset-empty-prompt": (lambda t: run_dataset(t, [{**GOOD_ROW, "prompt_token_ids": []}]),
                             "d.jsonl:1: field 'prompt_token_ids': expected a non-empty list"),
    "dataset-too-long": (lambda t: run_dataset(t, [GOOD_ROW, {**GOOD_ROW, "request_id": "b",
                                                              "prompt_token_ids": [7] * 2000, "output_len": 100}]),
                         "d.jsonl: request 2 ('b'): prompt 2000 + output 100 = 2100 tokens "
                         "> engine.max_model_len 2048"),
    "dataset-duplicate-request-id": (lambda t: run_dataset(t, [GOOD_ROW, {**GOOD_ROW, "request_id": "b"}, GOOD_ROW]),
                                     "d.jsonl:3: duplicate request_id 'a'"),
    "dataset-missing-field": (lambda t: run_dataset(t, [{"request_id": "a", "prompt_token_ids": [1]}]),
                              "d.jsonl:1: missing field 'output_len'"),
    "dataset-output-len-zero": (lambda t: run_dataset(t, [GOOD_ROW, {**GOOD_ROW, "request_id": "b", "output_len": 0}]),
                                "d.jsonl:2: field 'output_len': expected an integer > 0, got 0"),
    "dataset-output-len-bool": (lambda t: run_dataset(t, [{**GOOD_ROW, "output_len": True}]),
                                "d.jsonl:1: field 'output_len'"),
    "dataset-unknown-field": (lambda t: run_dataset(t, [{**GOOD_ROW, "prompt": "hi"}]),
                              "d.jsonl:1: unknown field 'prompt'"),
    "dataset-negative-group": (lambda t: run_dataset(t, [{**GOOD_ROW, "group": -1}]), "d.jsonl:1: field 'group'"),
    # --- `prefixstudy dataset show` ---
    "show-not-found": (lambda t: ["dataset", "show", t / "nope.jsonl"], "nope.jsonl: dataset file not found"),
    "show-empty": (lambda t: ["dataset", "show", jsonl(t, [])], "d.jsonl: dataset is empty"),
    "show-malformed-line-3": (lambda t: ["dataset", "show", jsonl(t, [GOOD_ROW, "", "{oops}"])],
                              "d.jsonl:3: malformed JSON"),
    "show-duplicate-request-id": (lambda t: ["dataset", "show", jsonl(t, [GOOD_ROW, GOOD_ROW])],
                                  "d.jsonl:2: duplicate request_id 'a'"),
    "show-not-utf8": (lambda t: ["dataset", "show", raw(t, "d.jsonl", b"\xff\xfe{}\n")], "d.jsonl: not UTF-8 text"),
    # --- TensorRT-LLM prepare_dataset.py JSONL ---
    "trtllm-jsonl-missing-output-tokens": (
        lambda t: trt_jsonl(t, [{"task_id": 0, "input_ids": [1, 2], "output_tokens": 3},
                                {"task_id": 1, "input_ids": [1, 2]}]),
        "t.jsonl:2: missing field 'output_tokens'"),
    "trtllm-jsonl-negative-token": (lambda t: trt_jsonl(t, [{"task_id": 0, "input_ids": [1, -5], "output_tokens": 3}]),
                                    "t.jsonl:1: field 'input_ids': token ids must be integers >= 0, got -5"),
    "trtllm-jsonl-output-zero": (lambda t: trt_jsonl(t, [{"task_id": 0, "input_ids": [1], "output_tokens": 0}]),
                                 "t.jsonl:1: field 'output_tokens'"),
    "trtllm-jsonl-malformed": (lambda t: trt_jsonl(t, [{"task_id": 0, "input_ids": [1], "output_tokens": 2},
                                                       '{"task_id": 1, "input_ids": [1'],),
                               "t.jsonl:2: malformed JSON"),
    "trtllm-jsonl-duplicate-task-id": (
        lambda t: trt_jsonl(t, [{"task_id": 7, "input_ids": [1], "output_tokens": 2},
                                {"task_id": 7, "input_ids": [2], "output_tokens": 2}]),
        "t.jsonl:2: duplicate task_id '7'"),
    "trtllm-jsonl-blank-only": (lambda t: trt_jsonl(t, ["", "  "]), "t.jsonl: dataset is empty"),
    "trtllm-source-not-found": (lambda t: ["dataset", "import", t / "nope.json", t / "out.jsonl", "--format", "trtllm"],
                                "nope.json: dataset file not found"),
    # --- TensorRT-LLM gptManagerBenchmark JSON ---
    "trtllm-json-samples-not-list": (lambda t: trt_json(t, {"input_ids": [1]}),
                                     "t.json: field 'samples': expected a list"),
    "trtllm-json-missing-output-len": (
        lambda t: trt_json(t, [{"input_ids": [1, 2], "output_len": 3, "task_id": 0}, {"input_ids": [1], "task_id": 1}]),
        "t.json: samples[1]: missing field 'output_len'"),
    "trtllm-json-float-token": (lambda t: trt_json(t, [{"input_ids": [1, 2.0], "output_len": 3, "task_id": 0}]),
                                "t.json: samples[0]: field 'input_ids'"),
    "trtllm-json-sample-not-object": (lambda t: trt_json(t, [[1, 2]]), "t.json: samples[0]: expected a JSON object"),
    "trtllm-json-empty-samples": (lambda t: trt_json(t, []), "t.json: dataset is empty"),
    "trtllm-json-malformed": (
        lambda t: trt_json(t, None, '{\n  "metadata": {},\n  "samples": [\n'
                                    '    {"input_ids": [1, 2], "output_len": 3, "task_id": 0},\n'
                                    '    {"input_ids": [1, 2] "output_len": 3, "task_id": 1}\n  ]\n}\n'),
        "t.json: line 5: malformed JSON"),
    "trtllm-output-is-directory": (
        lambda t: ["dataset", "import", jsonl(t, [{"task_id": 0, "input_ids": [1], "output_tokens": 2}], "t.jsonl"),
                   t, "--format", "trtllm"],
        ": is a directory, expected a dataset file name"),
    "trtllm-unknown-format": (lambda t: ["dataset", "import", jsonl(t, [GOOD_ROW]), t / "out.jsonl", "--format", "xml"],
                              "'--format'"),
    # --- `prefixstudy dataset make` flags ---
    "make-token-low-above-high": (lambda t: ["dataset", "make", t / "out.jsonl",
                                             "--token-low", 500, "--token-high", 100],
                                  "--token-low 500 must be < --token-high 100"),
    "make-empty-prompt": (lambda t: ["dataset", "make", t / "out.jsonl", "--prefix-len", 0, "--suffix-len", 0],
                          "--prefix-len and --suffix-len are both 0"),
    "make-zero-requests": (lambda t: ["dataset", "make", t / "out.jsonl", "-n", 0], "'-n' / '--num-requests'"),
    "make-out-under-a-file": (lambda t: ["dataset", "make", raw(t, "f", "x") / "out.jsonl", "-n", 2],
                              "out.jsonl: cannot write the dataset"),
    # --- `prefixstudy run` flags ---
    "flag-rates-zero": (lambda t: ["run", "--rates", "0", "--out", t / "res"], "Invalid value for '--rates'"),
    "flag-rates-negative": (lambda t: ["run", "--rates", "-1", "--out", t / "res"], "Invalid value for '--rates'"),
    "flag-rates-abc": (lambda t: ["run", "--rates", "abc", "--out", t / "res"],
                       "Invalid value for '--rates': 'abc' is not a number"),
    "flag-rates-nan": (lambda t: ["run", "--rates", "1,nan", "--out", t / "res"], "Invalid value for '--rates'"),
    "flag-rates-inf": (lambda t: ["run", "--rates", "inf", "--out", t / "res"], "Invalid value for '--rates'"),
    "flag-rates-empty-item": (lambda t: ["run", "--rates", "1,,2", "--out", t / "res"],
                              "Invalid value for '--rates': '' is not a number"),
    "flag-num-requests-zero": (lambda t: ["run", "--num-requests", "0", "--out", t / "res"],
                               "Invalid value for '--num-requests'"),
    "flag-modes-unknown": (lambda t: ["run", "--modes", "on,sideways", "--out", t / "res"],
                           "--modes/--set sweep.modes: field 'sweep.modes': 'sideways' is not an arm (on, off)"),
    "flag-modes-empty-item": (lambda t: ["run", "--modes", "on,,off", "--out", t / "res"],
                              "Invalid value for '--modes': 'on,,off' has an empty arm name"),
    "flag-set-kind-over-a-file-for-another-kind": (lambda t: run_cfg(t, None, "--set", "engine.kind=echo"),
                                                   "c.yaml sets field 'engine.dtype', which engine.kind echo has no "
                                                   "field for; remove it from the file, or set engine.kind: echo there"),
    # --- arms (prefixstudy.config.arms) ---
    "arm-duplicate-name": (lambda t: run_cfg(t, {"arms": [{"name": "bs64", "engine": {"block_size": 64}},
                                                          {"name": "bs64"}]}),
                           "c.yaml: field 'arms.1.name': duplicate arm name 'bs64'"),
    "arm-builtin-name": (lambda t: run_cfg(t, {"arms": [{"name": "off", "engine": {"block_size": 64}}]}),
                         "c.yaml: field 'arms.0.name': 'off' is a built-in arm"),
    "arm-unknown-key": (lambda t: run_cfg(t, {"arms": [{"name": "a", "engines": {"block_size": 64}}]}),
                        "c.yaml: field 'arms.0.engines': unknown key"),
    "arm-overlay-field-the-backend-lacks": (lambda t: run_cfg(t, {"arms": [{"name": "a", "engine": {"targets": {}}}]}),
                                            "c.yaml: field 'arms.0.engine.targets': engine.kind vllm has no such field"),
    "arm-overlay-bad-value": (lambda t: run_cfg(t, {"arms": [{"name": "a", "engine": {"max_num_seqs": 0}}]}),
                              "c.yaml: field 'arms.0.engine.max_num_seqs': Input should be greater than 0"),
    "arm-baseline-not-an-arm": (lambda t: run_cfg(t, {"sweep": {"baseline": "bs64"}}),
                                "c.yaml: field 'sweep.baseline': 'bs64' is not one of the arms run"),
    "arm-mode-not-an-arm-with-arms": (lambda t: run_cfg(t, {"sweep": {"modes": ["on", "bs46"]},
                                                            "arms": [{"name": "bs64", "engine": {"block_size": 64}}]}),
                                      "c.yaml: field 'sweep.modes': 'bs46' is not an arm (on, off, bs64)"),
    "arm-offload-size-zero": (lambda t: run_cfg(t, {"arms": [{"name": "t", "offload": {"size_gib": 0}}]}),
                              "c.yaml: field 'arms.0.offload.size_gib': Input should be greater than 0"),
    "arm-offload-lmcache": (lambda t: run_cfg(t, {"arms": [{"name": "t", "offload": {
        "size_gib": 4, "backend": "lmcache"}}]}),
        "field 'arms.0.offload.backend': lmcache is vLLM's LMCacheMPConnector, a client of a separate LMCache server"),
    "arm-offload-on-echo": (lambda t: ["run", raw(t, "c.yaml", yaml.safe_dump(
        {**base_config(), "engine": {"kind": "echo"}, "arms": [{"name": "t", "offload": {"size_gib": 4}}]})),
        "--out", t / "res"],
                            "field 'arms.0.offload': engine.kind echo has no CPU tier"),
    "arm-offload-on-the-cpu": (lambda t: run_cfg(t, {"device": "cpu", "arms": [{"name": "t", "offload": {"size_gib": 4}}]}),
                               "c.yaml: field 'arms.0.offload': vLLM's KV offloading connector runs on CUDA, ROCm or XPU"),
    "arm-offload-on-this-cpu-machine": (lambda t: run_cfg(t, {"arms": [{"name": "t", "offload": {"size_gib": 4}}]}),
                                        "field 'arms.0.offload': vLLM's KV offloading connector runs on CUDA, ROCm "
                                        "or XPU; this machine's engines run on the CPU (arm t)"),
    "flag-executor-unknown": (lambda t: ["run", "--executor", "gpu", "--out", t / "res"],
                              "Invalid value for '--executor'"),
    "flag-unknown-option": (lambda t: ["run", "--bogus", "--out", t / "res"], "No such option '--bogus'"),
    "flag-set-without-equals": (lambda t: ["run", "--set", "sweep.num_requests", "--out", t / "res"],
                                "--set sweep.num_requests: expected key=value"),
    "flag-set-on-non-section": (lambda t: ["run", "--set", "sweep.rates.x=1", "--out", t / "res"],
                                "--set sweep.rates.x: 'rates' is not a section"),
    "flag-set-bad-value": (lambda t: ["run", "--set", "engine.max_model_len=abc", "--out", t / "res"],
                           "--set engine.max_model_len: field 'engine.max_model_len': Input should be a valid integer"),
    "flag-set-unknown-key": (lambda t: ["run", "--set", "sweep.bogus=1", "--out", t / "res"],
                             "--set sweep.bogus: field 'sweep.bogus': unknown key"),
    "flag-set-zero-rate": (lambda t: ["run", config(t), "--set", "sweep.rates=[0]", "--out", t / "res"],
                           "--set sweep.rates: field 'sweep.rates'"),
    # --- the peers' flags ---
    "flag-burstiness-with-poisson": (lambda t: run_cfg(t, {"arrivals": {"process": "poisson"}}, "--burstiness", "0.5"),
                                     "c.yaml: field 'arrivals': Value error, burstiness 0.5 applies to gamma arrivals "
                                     "only, and process is poisson"),
    "burstiness-with-constant-yaml": (lambda t: run_cfg(t, {"arrivals": {"process": "constant", "burstiness": 2}}),
                                      "c.yaml: field 'arrivals': Value error, burstiness 2 applies to gamma"),
    "flag-request-rate-abc": (lambda t: ["run", "--request-rate", "1,abc", "--out", t / "res"],
                              "Invalid value for '--request-rate': 'abc' is not a number"),
    "flag-request-rate-and-rates": (lambda t: ["run", "--request-rate", "inf", "--rates", "1", "--out", t / "res"],
                                    "--request-rate and --rates both given; use one"),
    "flag-max-concurrency-zero": (lambda t: ["run", "--max-concurrency", "0", "--out", t / "res"],
                                  "Invalid value for '--max-concurrency'"),
    "flag-percentiles-zero": (lambda t: ["run", "--percentiles", "0,50", "--out", t / "res"],
                              "--percentiles 0,50: 0 is not in (0, 100]"),
    "flag-percentiles-abc": (lambda t: ["run", "--percentiles", "50,p99", "--out", t / "res"],
                             "--percentiles 50,p99: 'p99' is not a number"),
    "flag-goodput-not-a-number": (lambda t: ["run", "--goodput", "ttft:fast", "--out", t / "res"],
                                  "--goodput 'ttft:fast': 'fast' is not a number"),
    "flag-slo-bad-token": (lambda t: ["run", "--slo", "e2e_p90:2000,latency_p90:5", "--out", t / "res"],
                           "--slo e2e_p90:2000,latency_p90:5: 'latency_p90' is not METRIC_pPCT"),
    "flag-slo-not-ms": (lambda t: ["run", "--slo", "ttft_p99:soon", "--out", t / "res"],
                        "--slo ttft_p99:soon: 'ttft_p99:soon': 'soon' is not a number of ms"),
    "slo-objective-yaml": (lambda t: run_cfg(t, {"sweep": {"slo": {"objectives": {"e2e_90": 100}}}}),
                           "c.yaml: field 'sweep.slo.objectives': Value error, 'e2e_90' is not METRIC_pPCT"),
    "slo-with-only-repeats": (lambda t: run_cfg(t, {"sweep": {"repeats": 2, "only_repeats": [0],
                                                              "slo": {"objectives": {"e2e_p90": 100}}}}),
                              "only_repeats: an SLO search runs its repeats where it ends"),
    "flag-metadata-without-equals": (lambda t: ["run", "--metadata", "gpu", "--out", t / "res"],
                                     "--metadata gpu: expected key=value"),
    "flag-target-not-http": (lambda t: run_cfg(t, None, "--target-on", "ftp://host"),
                             "field 'engine.targets': Value error, on: 'ftp://host' is not an http"),
    "http-engine-without-target": (lambda t: ["run", raw(t, "c.yaml", yaml.safe_dump(
        {**base_config(), "engine": {"kind": "http", "targets": {"on": "http://x"}}})), "--out", t / "res"],
                                   "field 'engine.targets.off': no server URL for caching OFF"),
    # --- --resume ---
    "resume-with-other-options": (lambda t: ["run", "--resume", recorded_run(t), "--rates", "1"],
                                  "--resume takes the recorded config"),
    "resume-missing-folder": (lambda t: ["run", "--resume", t / "nope"], "nope: results folder not found"),
    "resume-not-a-results-folder": (lambda t: ["run", "--resume", raw(t, "notes.txt", "x").parent],
                                    "no manifest.json here or in a sub-folder"),
    "resume-config-differs": (
        lambda t: ["run", config(t, {"sweep": {"num_requests": 5}}), "--resume", recorded_run(t)],
        "c.yaml: differs from the config recorded in"),
    # --- the many-prefix, session and trace workloads ---
    "trace-line-malformed": (lambda t: run_cfg(t, {"dataset": {"kind": "trace", "path": str(raw(
        t, "t.jsonl", '{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1]}\n{"timestamp": 1,\n'))}}),
        "t.jsonl:2: malformed JSON"),
    "trace-input-longer-than-its-blocks": (lambda t: run_cfg(t, {"dataset": {"kind": "trace", "path": str(raw(
        t, "t.jsonl", '{"timestamp": 0, "input_length": 600, "output_length": 2, "hash_ids": [1]}\n'))}}),
        "t.jsonl:1: field 'input_length': 600 tokens do not fit 1 hash blocks of 512 tokens"),
    "trace-bad-layout": (lambda t: run_cfg(t, {"dataset": {"kind": "trace", "path": "x.jsonl",
                                                          "trace": {"layout": "nope"}}}),
                         "c.yaml: field 'dataset.trace.layout'"),
    "mix-bad-popularity": (lambda t: run_cfg(t, {"dataset": {"kind": "groups", "mix": {"popularity": "pareto"}}}),
                           "c.yaml: field 'dataset.mix.popularity'"),
    "mix-given-to-fixed": (lambda t: run_cfg(t, {"dataset": {"mix": {"order": "random"}}}),
                           "'mix' is read by kind groups, not fixed"),
    "sessions-zero-turns": (lambda t: run_cfg(t, {"dataset": {"kind": "sessions", "sessions": {"turns": 0}}}),
                            "field 'dataset.sessions.turns': a session has at least 1 turn"),
    "jsonl-parent-not-earlier": (lambda t: run_cfg(t, {"dataset": {"path": str(raw(t, "d.jsonl", json.dumps(
        {**GOOD_ROW, "parent": 0}) + "\n"))}}), "d.jsonl:1: field 'parent': 0 is not an earlier row"),
    "merge-run-with-capacity-sweep": (lambda t: ["merge", recorded_run(t), raw(t, "sweep/sweep.json", json.dumps(
        {"axes": {"capacity.blocks": []}, "cells": []})).parent, "--out", t / "res"],
        "merge: give either run folders or capacity sweep folders, not both"),
    "capacity-bad-unit": (lambda t: ["capacity", config(t), "--capacity", "pages=1", "--out", t / "res"],
                          "--capacity 'pages=1': expected UNIT=V1,V2,... with UNIT one of blocks, bytes, share, "
                          "offload_gib, tier_blocks"),
    # --- `prefixstudy simulate`: architectures the roofline does not cover, transfers it cannot make ---
    "simulate-moe-model": (lambda t: simulate_model(t, {"num_local_experts": 8, "num_experts_per_tok": 2}),
                           "config.json: field 'num_local_experts': mixture-of-experts is not covered"),
    "simulate-sliding-window-model": (lambda t: simulate_model(t, {"sliding_window": 4096}),
                                      "config.json: field 'sliding_window': sliding-window attention is not covered"),
    "simulate-mla-model": (lambda t: simulate_model(t, {"kv_lora_rank": 512, "q_lora_rank": 1536}),
                           "config.json: field 'kv_lora_rank': multi-head latent attention (MLA) is not covered"),
    "simulate-mixed-layer-kinds": (
        lambda t: simulate_model(t, {"layer_types": ["full_attention", "sliding_attention"]}),
                                   "config.json: field 'layer_types': sliding_attention layers are not covered"),
    "simulate-quantized-model": (lambda t: simulate_model(t, {"quantization_config": {"quant_method": "awq"}}),
                                 "config.json: field 'quantization_config': a quantized checkpoint is not covered"),
    "simulate-other-model-on-a-cpu-calibration": (
        lambda t: ["simulate", config(t, {"model": str(MISTRAL)}), "--calibration",
                   REPO / "experiments/results/cpu-default", "--out", t / "res", "--no-report"],
        "is not the model the calibration ran ("),
    "simulate-cost-model-without-its-target": (
        lambda t: ["simulate", config(t), "--calibration", raw(t, "cost_model.json", json.dumps(
            {"c0_ms": 1.0, "coef_ms": {"prefill_tokens": 0.01}})), "--out", t / "res", "--no-report"],
        "cost_model.json: field 'transfer.target' missing"),
    # --- engine arguments vLLM does not know (imports vllm: the slow case) ---
    "engine-extra-arg-unknown": (lambda t: run_cfg(t, {"engine": {"extra_args": {"no_such_vllm_arg": 1}}}),
                                 "field 'engine.extra_args.no_such_vllm_arg': unknown vLLM engine argument"),
}


def _snapshot(tmp: Path) -> set[str]:
    return {str(p.relative_to(tmp)) for p in tmp.rglob("*")}


@pytest.fixture(scope="module")
def launched(request, tmp_path_factory):
    """Start the selected cases' CLI runs up front, a few at a time, so the corpus stays fast on
    two cores; the slow engine-argument case goes first.  Each test then checks its own run."""
    selected = [it.callspec.params["case"] for it in request.session.items
                if it.module is sys.modules[__name__] and hasattr(it, "callspec")]
    selected.sort(key=lambda c: c != "engine-extra-arg-unknown")
    pool = ThreadPoolExecutor(max_workers=3)
    runs = {}
    for case in selected:
        tmp = tmp_path_factory.mktemp(case)
        args = CASES[case][0](tmp)
        runs[case] = (tmp, _snapshot(tmp), pool.submit(cli, *args))
    yield runs
    pool.shutdown(wait=True, cancel_futures=True)


# The one case that imports vLLM (about 13 s of CPU) runs in `make test`, not `make test-fast`.
@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.slow) if c == "engine-extra-arg-unknown" else c
                                  for c in CASES], ids=list(CASES))
def test_bad_input_is_one_line_and_exit_2(case, launched):
    tmp_path, before, future = launched[case]
    expected = CASES[case][1]
    r = future.result()
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "Traceback" not in r.stdout + r.stderr
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("error: "), lines[0]
    assert expected in lines[0], lines[0]
    # Nothing written: no results folder, no dataset file, no change to a recorded run.
    res = tmp_path / "res"
    assert not res.exists() or not any(res.iterdir())
    assert not (tmp_path / "out.jsonl").exists()
    assert _snapshot(tmp_path) == before
    if case == "resume-config-differs":
        assert "field 'sweep.num_requests' (5 vs recorded 4)" in lines[0]


def test_the_corpus_is_large_enough():
    assert len(CASES) >= 30
