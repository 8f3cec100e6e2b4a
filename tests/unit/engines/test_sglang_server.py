"""Backend ``sglang-server``: the command line it launches for ON and OFF, its refusals, and the
server it launches measured end to end, with the stand-in of SGLang's API (tests/sglang_stub.py)
launched in place of ``sglang.launch_server``."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from prefixstudy.config import load_config
from prefixstudy.engines.base import RequestTrace
from prefixstudy.engines.sglang_server import SERVER_MODULE_ENV, SglangServerEngine, server_command
from prefixstudy.errors import StudyFailed, UserError
from prefixstudy.study.preflight import check_engine_config, check_plan

REPO = Path(__file__).resolve().parents[3]
PREFIX = list(range(1000, 1056))  # 56 shared tokens


@pytest.fixture
def tok(tmp_path) -> Path:
    """A tokenizer folder (its tokenizer.json is only looked for, never read, here)."""
    (tmp_path / "tokenizer.json").write_text("{}")
    return tmp_path


def _cfg(**engine):
    return load_config(None, {"engine": {"kind": "sglang-server", **engine}, "executor": "local"})


def test_the_command_line_of_on_and_off(tok):
    cfg = _cfg(model_path="/m", tokenizer_path=str(tok), max_model_len=4096, max_running_requests=256,
               server_args=["--chunked-prefill-size", "8192"])
    on = server_command(cfg.model, cfg.arm_engine("on"), "on", 30000)
    assert on == [sys.executable, "-m", "sglang.launch_server", "--model-path", "/m", "--host", "127.0.0.1",
                  "--port", "30000", "--enable-cache-report", "--enable-metrics", "--context-length", "4096",
                  "--mem-fraction-static", "0.42", "--attention-backend", "triton", "--sampling-backend", "pytorch",
                  "--tp-size", "1", "--load-format", "dummy", "--tokenizer-path", str(tok),
                  "--max-running-requests", "256", "--chunked-prefill-size", "8192"]
    off = server_command(cfg.model, cfg.arm_engine("off"), "off", 30000)
    assert off == [*on[:-2], "--disable-radix-cache", *on[-2:]]  # the one difference: no radix cache
    # Without a model_path the study's model folder is served; a page size and no load format as set.
    plain = server_command("/study-model", _cfg(block_size=16, load_format=None).arm_engine("on"), "on", 1)
    assert plain[3:5] == ["--model-path", "/study-model"] and plain[-2:] == ["--page-size", "16"]
    assert "--load-format" not in plain


def _refusal(tmp_path, **engine) -> str:
    with pytest.raises(UserError) as e:
        check_engine_config(_cfg(**engine))
    return str(e.value)


def test_refusals_name_the_field_in_one_line(tok, monkeypatch):
    monkeypatch.delenv(SERVER_MODULE_ENV, raising=False)
    assert _refusal(tok, tokenizer_path=str(tok), server_args=["--skip-tokenizer-init"]) == (
        "field 'engine.server_args': --skip-tokenizer-init: SGLang 0.5.17 then answers prefixstudy's completions "
        "with HTTP 500 (KeyError 'text') and min_tokens with 400; give it a tokenizer (engine.tokenizer_path: a "
        "folder with a tokenizer.json)")
    assert _refusal(tok, tokenizer_path=str(tok), server_args=["--disable-radix-cache"]) == (
        "field 'engine.server_args': --disable-radix-cache is set by prefixstudy; set the arm's prefix_caching "
        "(false: --disable-radix-cache) instead")
    assert _refusal(tok, tokenizer_path=str(tok), server_args=["--port=1"]) == (
        "field 'engine.server_args': --port is set by prefixstudy; set port instead")
    assert _refusal(tok, tokenizer_path=str(tok), port=30000) == (
        "field 'engine.port': a fixed port serves one arm, and 2 run (on, off); leave it unset (a free port per "
        "arm) or run one arm with --modes")
    model = str(load_config(None, {}).model)  # the shipped tiny model: a config.json, no tokenizer
    assert _refusal(tok) == (f"field 'model': {model} has no tokenizer.json, and SGLang needs the model's tokenizer "
                             "(without it, 0.5.17 refuses prefixstudy's requests); set engine.tokenizer_path to a "
                             "folder with one")
    assert _refusal(tok, tokenizer_path=str(tok.parent)).startswith(f"field 'engine.tokenizer_path': {tok.parent} "
                                                                    "has no tokenizer.json")
    # Everything else in order, SGLang itself is missing here.
    assert _refusal(tok, tokenizer_path=str(tok)) == (
        "field 'engine.kind': sglang-server launches SGLang, which is not installed here (pip install sglang; it "
        "needs a CUDA GPU)")


def test_arms_up_at_once_are_refused_because_sglang_sizes_itself_by_the_free_memory(tok):
    cfg = _cfg(tokenizer_path=str(tok))
    with pytest.raises(UserError) as e:
        check_plan(cfg)
    assert str(e.value) == ("field 'sweep.interleave_arms': engine.kind sglang-server sizes each engine by the memory "
                            "free when it starts, so 2 arms up at once on one device would not get the same KV cache; "
                            "set sweep.interleave_arms: false (one arm's engine at a time)")
    check_plan(load_config(None, {"engine": {"kind": "sglang-server"}, "executor": "local",
                                  "sweep.interleave_arms": False}))
    check_plan(load_config(None, {"engine": {"kind": "sglang-server"}, "executor": "local", "sweep.modes": ["on"]}))


def test_the_cli_refuses_with_exit_code_2_and_one_line(tok, tmp_path):
    """Before any results folder exists (a dry run checks the config, not what the server needs)."""
    env = {k: v for k, v in os.environ.items() if k != SERVER_MODULE_ENV}
    r = subprocess.run([sys.executable, "-m", "prefixstudy", "run", "--set", "engine.kind=sglang-server",
                        "--set", f"engine.tokenizer_path={tok}", "--set", "sweep.interleave_arms=false",
                        "--executor", "local", "--out", str(tmp_path / "res")],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert r.stderr.strip() == ("error: field 'engine.kind': sglang-server launches SGLang, which is not installed "
                                "here (pip install sglang; it needs a CUDA GPU)")
    assert not (tmp_path / "res").exists()


def _argv(base: str) -> list[str]:
    with urllib.request.urlopen(f"{base}/stub/argv", timeout=5) as r:
        return json.loads(r.read())


async def _measure(engine: SglangServerEngine) -> tuple[list[RequestTrace], dict, list[str]]:
    """Start the arm's server; two requests sharing a 56-token prefix, a reset while a third runs,
    then the point's metadata; the server's command line; shut it down."""
    await engine.start()
    try:
        argv = _argv(engine.http.base)
        await engine.reset_prefix_cache()
        await engine.begin_point()
        traces = [await engine.generate(PREFIX + [7000 + i] * 8, 4, f"r{i}", RequestTrace(0.0)) for i in range(2)]
        meta = await engine.end_point()
        streaming = RequestTrace(0.0)
        slow = asyncio.ensure_future(engine.generate(PREFIX + [9000] * 8, 30, "r2", streaming))
        # r2's first token is out, 29 more 0.02 s apart: the first flushes answer 400 and are asked again
        while not streaming.token_times and not slow.done():
            await asyncio.sleep(0.005)
        await engine.reset_prefix_cache()
        assert slow.done() and slow.result().error == ""
        return traces, meta, argv
    finally:
        await engine.aclose()
        engine.shutdown()


@pytest.mark.parametrize("mode", ["on", "off"])
def test_the_launched_server_is_measured_reset_and_killed(tok, monkeypatch, mode):
    monkeypatch.setenv(SERVER_MODULE_ENV, "tests.sglang_stub")
    cfg = _cfg(tokenizer_path=str(tok), startup_timeout_s=60, server_args=["--stub-token-delay-s", "0.02"])
    check_engine_config(cfg)  # the stand-in counts as installed
    engine = SglangServerEngine(cfg.model, cfg.arm_engine(mode), mode)
    monkeypatch.chdir(REPO)  # `python -m tests.sglang_stub` from the repository's root
    traces, meta, argv = asyncio.run(_measure(engine))
    port = argv[argv.index("--port") + 1]
    assert [sys.executable, "-m", "tests.sglang_stub", *argv] == server_command(cfg.model, cfg.arm_engine(mode),
                                                                                mode, int(port))
    assert ("--disable-radix-cache" in argv) == (mode == "off")
    # Page size 1: the second request finds the 56 shared tokens, the first (after the reset) none.
    assert [t.num_cached_tokens for t in traces] == ([0, 56] if mode == "on" else [0, 0])
    assert [len(t.token_times) for t in traces] == [4, 4]
    assert (engine.block_size, engine.startup_s > 0) == (1, True)
    # SGLang's null details of an uncached request are 0 cached tokens, not an unreported count.
    assert meta["cached_tokens_reported"] is True and meta["prefix_cache_reset"] is True
    assert (meta["server_prefix_queries"], meta["server_prefix_hits"]) == (128, 56 if mode == "on" else 0)
    assert engine.proc is None and engine.log_path == ""  # killed, its log dropped


def test_a_server_that_does_not_come_up_fails_with_its_log(tok, monkeypatch):
    monkeypatch.setenv(SERVER_MODULE_ENV, "tests.sglang_stub")
    # A second --port without a value (the check before a run refuses it; built directly here): the
    # stand-in's argument parser exits at once.
    cfg = _cfg(tokenizer_path=str(tok), server_args=["--port"])
    engine = SglangServerEngine(cfg.model, cfg.arm_engine("on"), "on")
    monkeypatch.chdir(REPO)
    with pytest.raises(StudyFailed) as e:
        asyncio.run(engine.start())
    assert str(e.value).startswith("sglang (caching ON) did not come up: server for caching ON exited before it "
                                   "was healthy")
    assert "--port: expected one argument" in e.value.log
    assert engine.proc is None and engine.log_path == ""


@pytest.mark.slow
def test_a_study_launches_a_server_per_arm_and_reads_its_cache(tok, monkeypatch, tmp_path):
    from prefixstudy.results import load
    from prefixstudy.study.orchestrate import run_study

    monkeypatch.setenv(SERVER_MODULE_ENV, "tests.sglang_stub")
    monkeypatch.chdir(REPO)
    cfg = load_config(None, {"engine": {"kind": "sglang-server", "tokenizer_path": str(tok), "max_running_requests": 8},
                             "executor": "local", "out": str(tmp_path / "res"), "dataset.prefix_len": 56,
                             "dataset.suffix_len": 8, "dataset.output_len": 4, "dataset.groups": 2,
                             "sweep.rates": [20], "sweep.num_requests": 8, "sweep.warmup_requests": 1,
                             "sweep.interleave_arms": False})
    res = load(run_study(cfg, progress=False))
    r = res.measured
    assert (r["error"] == "").all() and len(r) == 16
    ron, roff = r[r["mode"] == "on"], r[r["mode"] == "off"]
    # ON: the client's own replay of a page-size-1 radix cache, request by request; OFF: nothing.
    assert (ron["num_cached_tokens"] >= 56).all()
    assert ron["num_cached_tokens"].tolist() == ron["expected_cached_tokens"].tolist()
    assert roff["num_cached_tokens"].tolist() == [0] * 8
    s = res.summary.set_index("mode")
    assert s.loc["on", "server_prefix_hits"] == ron["num_cached_tokens"].sum()
    assert s.loc["off", "server_prefix_queries"] == 8 * 64 and s.loc["off", "server_prefix_hits"] == 0
    assert bool(s.loc["on", "hit_rate_ok"]) and bool(s.loc["off", "hit_rate_ok"])
    pts = {p["mode"]: p for p in res.manifest["points"]}
    assert pts["off"]["cached_tokens_reported"] is True and pts["on"]["block_size"] == 1
    assert res.manifest["engine"] == "sglang-server"


def test_h200_sglang_replays_h200_tp1_s_workload_and_schedule():
    """The shipped SGLang study differs from the vLLM headline only in its engine (and in running
    one arm's server at a time): the same model, dataset, rates, repeats and seeds, so every point's
    arrival schedule is the same draw, and `prefixstudy compare` puts the four arms side by side."""
    from prefixstudy.config import flat_config
    from prefixstudy.configs import shipped_config

    sgl, vllm = (load_config(shipped_config(n)) for n in ("h200-sglang", "h200-tp1"))
    a, b = flat_config(sgl.model_dump(mode="json")), flat_config(vllm.model_dump(mode="json"))
    differ = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
    assert [k for k in differ if not k.startswith("engine.")] == ["executor", "study", "sweep.interleave_arms"]
    e, v = sgl.engine, vllm.engine
    assert (e.max_model_len, e.tensor_parallel_size, e.load_format) == (v.max_model_len, v.tensor_parallel_size,
                                                                        v.load_format) == (4096, 1, "dummy")
    # The same admission limit and prefill chunk as vLLM's engine.
    assert (e.max_running_requests, e.server_args) == (v.max_num_seqs, ["--chunked-prefill-size",
                                                                        str(v.max_num_batched_tokens)])
    check_plan(sgl)  # one server at a time: the plan is accepted
