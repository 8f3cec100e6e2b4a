"""prefixstudy.model / gpus / cli_model: exact arithmetic, the reported case, calibration, CLI errors.

Expected numbers are worked out by hand in the comments; tests never re-derive a formula.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from click.testing import CliRunner

from prefixstudy.model import roofline as m
from prefixstudy.cli.model import model as model_cmd
from prefixstudy.errors import UserError
from prefixstudy.model.gpus import find_gpu, get_gpu, load_gpus
from prefixstudy.schema import ITERATION_COLUMNS, REQUEST_COLUMNS, SUMMARY_COLUMNS

REPO = Path(__file__).resolve().parents[1]
MISTRAL = REPO / "prefixstudy/configs/models/mistral-7b-v0.3"


@pytest.fixture(scope="module")
def mistral() -> m.Arch:
    return m.load_arch(MISTRAL)


@pytest.fixture(scope="module")
def a100x8(mistral) -> m.Deployment:
    return m.Deployment(mistral, get_gpu("A100-SXM4-40GB"), tp=8)  # PEAK efficiencies


# --------------------------------------------------------------------------- architecture

def test_mistral_params_and_kv(mistral):
    # attention/layer: 2*4096*4096 + 2*4096*1024 = 33,554,432 + 8,388,608 = 41,943,040
    assert mistral.attn_params_per_layer == 41_943_040
    # MLP/layer: 3*4096*14336 = 176,160,768
    assert mistral.mlp_params_per_layer == 176_160_768
    # 32 * 218,103,808
    assert mistral.matmul_params == 6_979_321_856
    # embed + lm_head, untied: 2 * 32768*4096
    assert mistral.embedding_params == 268_435_456
    # (2*32 + 1) * 4096
    assert mistral.norm_params == 266_240
    assert mistral.bias_params == 0
    # 6,979,321,856 + 268,435,456 + 266,240
    assert mistral.total_params == 7_248_023_552
    assert mistral.total_params == pytest.approx(7.25e9, rel=1e-3)
    # 32 layers * 8 kv heads * 128 * 2 (K,V) * 2 bytes
    assert mistral.kv_bytes_per_token(2) == 131_072


def test_qwen2_biases_tied_and_default_head_dim():
    # Qwen2-0.5B's config.json fields; its published parameter count is 494,032,768.
    cfg = {"model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864,
           "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
           "vocab_size": 151936, "tie_word_embeddings": True}
    a = m.arch_from_config(cfg)
    assert a.head_dim == 64  # 896 / 14
    # q,k,v biases: (896 + 2*128) * 24
    assert a.bias_params == 27_648
    # one 151936 x 896 matrix (tied)
    assert a.embedding_params == 136_134_656
    # 24 * (1,835,008 + 13,074,432) + 136,134,656 + 27,648 + 49*896
    assert a.total_params == 494_032_768


def test_prefill_flops_reported_case(mistral, a100x8):
    w = m.prefill_work(mistral, 1214, 0)
    # 2 * 6,979,321,856 * 1214
    assert w.matmul_flops == 16_945_793_466_368
    # lm_head on the last token only: 2 * 134,217,728
    assert w.lm_head_flops == 268_435_456
    # keys = 1214*1215/2 = 737,505; 2 FLOP * 2 (QK,AV) * 32 layers * 4096 * 737,505
    assert w.attention_keys == 737_505
    assert w.attention_flops == 386_665_021_440
    assert w.flops == 17_332_726_923_264
    assert w.flops == pytest.approx(17.6e12, rel=0.03)  # DONE-WHEN: ~17.6 TFLOP within 3 %
    # 17,332,726,923,264 / (8 * 312e12) s
    assert a100x8.ideal_ms(w.flops) == pytest.approx(6.944201491692308, rel=1e-12)
    assert a100x8.ideal_ms(w.flops) == pytest.approx(7.0, rel=0.05)  # DONE-WHEN: ~7 ms within 5 %
    # all logits: 1214 * 268,435,456 instead of 1 * 268,435,456
    assert m.prefill_work(mistral, 1214, 0, all_logits=True).lm_head_flops == 325_880_643_584


def test_prefill_on_cached_prefix_and_saving(mistral, a100x8):
    w = m.prefill_work(mistral, 16, 1198)
    # keys = 16*1198 + 16*17/2 = 19,304; attention 524,288 * 19,304
    assert w.attention_flops == 10_120_855_552
    # 2 * 6,979,321,856 * 16 + 268,435,456 + 10,120,855,552
    assert w.flops == 233_727_590_400
    s = m.prefix_saving(a100x8, 1198, 16, 143)
    assert s.flops == 17_332_726_923_264 - 233_727_590_400
    # 17,098,999,332,864 / 2.496e15 s
    assert a100x8.ideal_ms(s.flops) == pytest.approx(6.850560630153846, rel=1e-12)


def test_decode_step_bytes_comm_and_time(mistral, a100x8):
    w = m.decode_work(mistral, 4, 1000)
    # 2 * (6,979,321,856 + 134,217,728) * 4 + 2*2*32*4096 * 4000
    assert w.flops == 56_908_316_672 + 2_097_152_000
    # weights 7,113,539,584 * 2 B; KV 4000 * 131,072 B
    assert w.weight_bytes == 14_227_079_168
    assert w.kv_bytes == 524_288_000
    assert w.allreduce_bytes == 32_768  # 4 tok * 4096 * 2 B
    t = a100x8.time(w)
    # per GPU: 1,778,384,896 + 65,536,000 = 1,843,920,896 B at 1555 GB/s
    assert t.memory_ms == pytest.approx(1_843_920_896 / 1.555e9, rel=1e-12)
    # 64 calls * (1.75 * 32,768 B / 300 GB/s + 10 us) = 64 * 10.191146667 us
    assert t.comm_ms == pytest.approx(0.6522333866666667, rel=1e-12)
    assert t.bound == "memory"
    assert t.total_ms == pytest.approx(t.memory_ms + t.comm_ms)
    one = m.Deployment(mistral, get_gpu("A100-SXM4-40GB"), tp=1)
    assert one.time(w).comm_ms == 0.0


def test_e2e_and_efficiencies(mistral):
    eff = m.Efficiency(mfu=0.5, bw_eff=0.5, overhead_ms=1.0, allreduce_latency_us=0.0)
    dep = m.Deployment(mistral, get_gpu("H100-SXM"), tp=1, eff=eff)
    r = m.predict_request(dep, 1214, 0, 143)
    # prefill: 17,332,726,923,264 / (989e12 * 0.5) s = 35.051015... ms, compute-bound, + 1 ms overhead
    assert r.prefill.compute_ms == pytest.approx(35.05101501165622, rel=1e-12)
    assert r.prefill.total_ms == pytest.approx(36.05101501165622, rel=1e-12)
    # decode at context 1214 + 71.5: (14,227,079,168 + 1285.5*131,072) B / (3350 GB/s * 0.5) + 1 ms
    assert r.decode_step.total_ms == pytest.approx((14_227_079_168 + 168_493_056) / 1.675e9 + 1.0, rel=1e-12)
    assert r.e2e_ms == pytest.approx(r.prefill.total_ms + 142 * r.decode_step.total_ms)


def test_rate_ceiling(a100x8):
    off = m.rate_ceiling(a100x8, 1214, 0, 143)
    on = m.rate_ceiling(a100x8, 1214, 1198, 143)
    assert off.prefill_rps == pytest.approx(2.496e15 / 17_332_726_923_264, rel=1e-12)  # 144.0 req/s
    assert on.prefill_rps == pytest.approx(2.496e15 / 233_727_590_400, rel=1e-12)
    assert on.engine_rps > off.engine_rps


# --------------------------------------------------------------------------- config errors

@pytest.mark.parametrize("cfg, field", [
    ({"model_type": "gpt2"}, "model_type"),
    ({"model_type": "llama", "hidden_size": 64}, "num_attention_heads"),
    ({"model_type": "llama", "hidden_size": "64"}, "hidden_size"),
    ({"model_type": "mistral", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 3},
     "num_key_value_heads"),
])
def test_bad_config_fields(cfg, field):
    with pytest.raises(UserError, match=f"field '{field}'"):
        m.arch_from_config(cfg, "x/config.json")


# --------------------------------------------------------------------------- GPU table

def test_gpu_table_and_device_names():
    a100 = find_gpu("NVIDIA A100-SXM4-40GB")
    assert (a100.bf16_tflops, a100.hbm_gb_s, a100.link_gb_s, a100.memory_gb) == (312, 1555, 300, 40)
    assert find_gpu("NVIDIA H200").name == "H200-SXM"
    assert find_gpu("NVIDIA H100 80GB HBM3").name == "H100-SXM"
    assert find_gpu("h100-sxm").name == "H100-SXM"
    assert find_gpu("NVIDIA L40S").hbm_gb_s == 864
    assert find_gpu("NVIDIA H100 PCIe") is None
    assert find_gpu("cpu") is None
    with pytest.raises(UserError, match="unknown GPU"):
        get_gpu("B200")


def test_gpus_file_override_and_add(tmp_path):
    p = tmp_path / "gpus.yaml"
    p.write_text(yaml.safe_dump({
        "H100-SXM": {"hbm_gb_s": 3000},
        "RTX-4090": {"bf16_tflops": 165.2, "hbm_gb_s": 1008, "link_gb_s": 32, "memory_gb": 24,
                     "aliases": ["NVIDIA GeForce RTX 4090"]},
    }))
    table = load_gpus(p)
    assert table["H100-SXM"].hbm_gb_s == 3000 and table["H100-SXM"].bf16_tflops == 989
    assert find_gpu("NVIDIA GeForce RTX 4090", table).bf16_tflops == 165.2
    p.write_text(yaml.safe_dump({"X": {"bf16_tflops": 1}}))
    with pytest.raises(UserError, match="entry 'X', field 'hbm_gb_s'"):
        load_gpus(p)


def test_model_module_needs_no_gpu_stack():
    code = ("import sys, prefixstudy.model.roofline, prefixstudy.cli.model; "
            "assert not {'torch', 'vllm', 'ray'} & set(sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


# --------------------------------------------------------------------------- CLI

def test_cli_explain_reported_case(monkeypatch):
    monkeypatch.chdir(REPO)
    r = CliRunner().invoke(model_cmd, ["--explain"])
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


def test_cli_summary_other_case(monkeypatch):
    monkeypatch.chdir(REPO)
    r = CliRunner().invoke(model_cmd, ["--model-dir", str(MISTRAL), "--gpu", "NVIDIA H200",
                                       "--tp", "1", "--explain"])
    assert r.exit_code == 0, r.output
    assert "1 x H200-SXM" in r.output and "no observation given" in r.output
    assert "TP = 1: none" in r.output


@pytest.mark.parametrize("args, needle", [
    (["--gpu", "B200"], "--gpu 'B200': unknown GPU"),
    (["--config-json", "nope/config.json"], "nope/config.json: config.json not found"),
    (["--prefix-len", "2000"], "--prefix-len 2000"),
])
def test_cli_errors_one_line_exit_2(args, needle):
    r = CliRunner().invoke(model_cmd, args)
    assert r.exit_code == 2
    assert r.output.strip().count("\n") == 0 and needle in r.output
    assert "Traceback" not in r.output


def test_cli_malformed_config_json(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text('{"model_type": "llama",\n "hidden_size": }')
    r = CliRunner().invoke(model_cmd, ["--config-json", str(bad)])
    assert r.exit_code == 2 and f"error: {bad}: line 2: invalid JSON" in r.output
    bad.write_text(json.dumps({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4}))
    r = CliRunner().invoke(model_cmd, ["--config-json", str(bad)])
    assert r.exit_code == 2 and "field 'intermediate_size' is missing" in r.output


# --------------------------------------------------------------------------- calibration

TRUE_EFF = m.Efficiency(mfu=0.55, bw_eff=0.8, overhead_ms=0.3, allreduce_latency_us=10.0)
# (mode, rate) -> decode batch size of that point; (off, 8) is saturated and full of junk.
POINTS = {("off", 1.0): 1, ("off", 2.0): 2, ("off", 4.0): 4,
          ("on", 1.0): 1, ("on", 2.0): 8, ("on", 4.0): 16}


def _full(rows: list[dict], columns) -> pd.DataFrame:
    df = pd.DataFrame(rows)
    for c in columns:
        default = "" if c in ("request_id", "error", "status") else 0
        df[c] = df[c].fillna(default) if c in df else default
    return df[list(columns)]


def _synthetic_study(root: Path, device: str = "NVIDIA H200") -> Path:
    """A study generated from the model itself at TRUE_EFF: H200, TP 2, Mistral-7B."""
    run = root / "run"
    run.mkdir()
    config = {"model": str(MISTRAL), "engine": {"tensor_parallel_size": 2},
              "dataset": {"prefix_len": 1198, "suffix_len": 16, "output_len": 143}}
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    (run / "manifest.json").write_text(json.dumps({"device": device}))
    dep = m.Deployment(m.load_arch(MISTRAL), get_gpu("H200-SXM"), tp=2, eff=TRUE_EFF)
    reqs, its, summ = [], [], []
    for (mode, rate), b in {**POINTS, ("off", 8.0): 3}.items():
        junk = rate == 8.0
        cached = 1184 if mode == "on" else 0  # 74 whole blocks of 16
        p = m.predict_request(dep, 1214, cached, 143, batch=b)
        for i in range(5):
            reqs.append(dict(mode=mode, rate=rate, request_index=i, prompt_tokens=1214, output_tokens=143,
                             num_cached_tokens=cached, warmup=False, error="",
                             prefill_ms=5000.0 if junk else p.prefill.total_ms,
                             decode_ms=142 * p.decode_step.total_ms, e2e_ms=p.e2e_ms))
        # ignored: a warm-up and an unfinished request
        reqs.append(dict(mode=mode, rate=rate, prompt_tokens=1214, output_tokens=143, warmup=True,
                         prefill_ms=999.0, decode_ms=999.0, e2e_ms=999.0, error=""))
        reqs.append(dict(mode=mode, rate=rate, prompt_tokens=1214, output_tokens=143, warmup=False,
                         prefill_ms=999.0, decode_ms=999.0, e2e_ms=999.0, error="unfinished: x"))
        its.append(dict(mode=mode, rate=rate, step_ms=math.nan, prompt_tokens=1214, generation_tokens=1))
        its.append(dict(mode=mode, rate=rate, step_ms=77.0, prompt_tokens=1214, generation_tokens=b))
        for _ in range(20):
            its.append(dict(mode=mode, rate=rate, num_running=b, prompt_tokens=0, generation_tokens=b,
                            step_ms=1000.0 if junk else p.decode_step.total_ms))
        summ.append(dict(mode=mode, rate=rate, status="ok", saturated=junk, error=""))
    _full(reqs, REQUEST_COLUMNS).to_parquet(run / "requests.parquet", index=False)
    _full(its, ITERATION_COLUMNS).to_parquet(run / "iterations.parquet", index=False)
    _full(summ, SUMMARY_COLUMNS).to_csv(run / "summary.csv", index=False)
    return run


def test_calibrate_recovers_known_efficiencies(tmp_path):
    from prefixstudy.results import load

    res = load(_synthetic_study(tmp_path))
    dep = m.deployment_from_study(res.config, res.manifest["device"])
    assert (dep.gpu.name, dep.tp, dep.dtype_bytes) == ("H200-SXM", 2, 2)
    fit = m.calibrate(res.summary, res.requests, res.iterations, dep)
    assert fit.mfu_fitted and fit.overhead_fitted and fit.notes == []
    assert fit.eff.mfu == pytest.approx(0.55, rel=1e-6)
    assert fit.eff.bw_eff == pytest.approx(0.8, rel=1e-6)
    assert fit.eff.overhead_ms == pytest.approx(0.3, rel=1e-6)
    assert (fit.decode_points, fit.decode_steps) == (5, 120)  # batches 1,2,4,8,16; 6 points x 20 steps
    assert fit.prefill_point == "off 1 req/s"

    df = m.model_vs_measurement(res.summary, res.requests, res.iterations, res.config, "NVIDIA H200")
    assert len(df) == 6 * 3  # unsaturated points x (prefill, decode step, E2E)
    assert set(df["quantity"]) == {"prefill_ms", "decode_step_ms", "e2e_ms"}
    assert df["error_pct"].abs().max() < 1e-4
    assert df.attrs["fit"]["eff"]["mfu"] == pytest.approx(0.55, rel=1e-6)
    assert m.model_vs_measurement(res.summary, res.requests, res.iterations, res.config, "cpu") is None


def test_calibrate_without_iteration_records(tmp_path):
    from prefixstudy.results import load

    res = load(_synthetic_study(tmp_path))
    dep = m.deployment_from_study(res.config, "NVIDIA H200")
    fit = m.calibrate(res.summary, res.requests, pd.DataFrame(), dep)
    # per-request decode steps at 1 req/s (batch 1) with the overhead held at its given
    # value (0): the 0.3 ms true overhead is then read as lower bandwidth
    assert not fit.overhead_fitted and fit.eff.overhead_ms == 0.0
    assert fit.eff.bw_eff < 0.8 and fit.mfu_fitted
    assert any("no pure-decode iteration records" in n for n in fit.notes)


def test_cli_calibrate_table_and_figure(tmp_path):
    run = _synthetic_study(tmp_path)
    r = CliRunner().invoke(model_cmd, ["--calibrate", str(run)])
    assert r.exit_code == 0, r.output
    assert "mfu 0.5500" in r.output and "bw_eff 0.8000" in r.output and "overhead 0.3000 ms" in r.output
    assert (run / "plots" / "model_calibration.png").stat().st_size > 0
    assert r.output.count("decode_step_ms") == 6


def test_cli_calibrate_unknown_device(tmp_path):
    run = _synthetic_study(tmp_path, device="cpu")
    r = CliRunner().invoke(model_cmd, ["--calibrate", str(run)])
    assert r.exit_code == 2 and "device 'cpu' is not in the GPU table" in r.output
