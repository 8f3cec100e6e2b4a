"""``prefixstudy model`` (prefixstudy.model.explain): the reported case, another case, input errors."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


def test_cli_explain_reported_case(monkeypatch, model_cli):
    monkeypatch.chdir(REPO)
    r = model_cli(["--explain"])
    assert r.exit_code == 0, r.output
    out = r.output
    section = out.split("3a.")[1].split("3b.")[0]
    total = float(re.search(r"total\s+= ([\d.]+) TFLOP", section).group(1))
    ideal = float(re.search(r"ideal time at peak: .* = ([\d.]+) ms", section).group(1))
    assert total == 17.333 and total == pytest.approx(17.6, rel=0.03)
    assert ideal == 6.944 and ideal == pytest.approx(7.0, rel=0.05)
    assert "(8 x 312 TFLOPS)" in section
    assert "1 FLOP per multiply-add                                 8.666 TFLOP  -> 3.47 ms" in out
    assert "saving 20.79 ms" in out and "6.85 ms compute-only at peak" in out
    assert "below the bandwidth floor" in out
    for flag in ("--mfu 0.5", "--bw-eff 0.8", "--overhead-ms 0", "--allreduce-latency-us 10"):
        assert flag in out


def test_cli_summary_other_case(monkeypatch, model_cli, mistral_dir):
    monkeypatch.chdir(REPO)
    r = model_cli(["--model-dir", str(mistral_dir), "--gpu", "NVIDIA H200", "--tp", "1", "--explain"])
    assert r.exit_code == 0, r.output
    assert "1 x H200-SXM" in r.output and "no observation given" in r.output
    assert "TP = 1: none" in r.output


@pytest.mark.parametrize("args, needle", [
    (["--gpu", "B200"], "--gpu 'B200': unknown GPU"),
    (["--config-json", "nope/config.json"], "nope/config.json: config.json not found"),
    (["--prefix-len", "2000"], "--prefix-len 2000"),
])
def test_cli_errors_one_line_exit_2(args, needle, model_cli):
    r = model_cli(args)
    assert r.exit_code == 2
    assert r.output.strip().count("\n") == 0 and needle in r.output
    assert "Traceback" not in r.output


def test_cli_malformed_config_json(tmp_path, model_cli):
    bad = tmp_path / "config.json"
    bad.write_text('{"model_type": "llama",\n "hidden_size": }')
    r = model_cli(["--config-json", str(bad)])
    assert r.exit_code == 2 and f"error: {bad}: line 2: invalid JSON" in r.output
    bad.write_text(json.dumps({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4}))
    r = model_cli(["--config-json", str(bad)])
    assert r.exit_code == 2 and "field 'intermediate_size' is missing" in r.output
