"""An engine's warm-up runs until its step time settles (prefixstudy.runner.warmup): the settle rule
on fixtures of warm and of still-moving engines, and the warm-up loop of a session on the echo
backend standing in for an engine that forms steps, its per-token cost set batch by batch."""

from __future__ import annotations

import asyncio
import math

import pytest

from prefixstudy.config import load_config
from prefixstudy.engines import RequestTrace
from prefixstudy.engines.echo import EchoEngine
from prefixstudy.engines.registry import Capabilities
from prefixstudy.runner import ModeSession, session as session_module
from prefixstudy.runner.warmup import batch_gap_ms, note, settled
from prefixstudy.workloads import load_rows


# --------------------------------------------------------------------------- the settle rule

def test_an_engine_whose_last_three_batches_agree_is_warm():
    assert settled([5.0, 4.1, 3.0, 2.91, 2.88, 2.90], 0.1)  # spread 0.03 ms, allowed 0.1 x 2.90 + 0.05
    assert settled([4.4, 4.1, 4.3], 0.1)  # a shared machine's noise: spread 0.3 ms, allowed 0.48
    assert settled([0.001, 0.003, 0.002], 0.1)  # a stub server's microseconds: within the floor


@pytest.mark.parametrize("gaps", [
    [3.47, 3.20, 2.95],         # the default study's cold ON engine: still 8 % faster batch by batch
    [3.40, 3.20, 3.00],         # a steady 6 % a batch: spread 0.40 ms > 0.1 x 3.20 + 0.05
    [2.90, 2.90],               # fewer than three batches
    [2.90, math.nan, 2.90],     # a batch without a token gap
    [2.90, 2.90, 2.90, 3.50],   # the last batch jumped
])
def test_a_still_moving_engine_is_not_warm(gaps):
    assert not settled(gaps, 0.1)


def test_a_batch_s_gap_is_the_median_over_its_finished_requests():
    traces = [RequestTrace(0.0, token_times=[0.0, 0.003, 0.006]), RequestTrace(0.0, token_times=[1.0, 1.002]),
              RequestTrace(0.0, token_times=[0.0, 0.5], error="unfinished")]
    assert batch_gap_ms(traces) == pytest.approx(3.0)  # gaps 3, 3, 2 ms; the failed request's 500 ms left out
    assert math.isnan(batch_gap_ms([RequestTrace(0.0, token_times=[0.0])]))


@pytest.mark.parametrize("mode", ["on", "on-a-long-arm-name-of-an-offload-study-with-a-cpu-tier-of-64-gib"])
def test_an_unsettled_warm_up_is_one_console_line_of_at_most_120_characters(mode):
    line = note(mode, {"settled": False, "stopped": "max_batches", "batches": 1000})
    assert line.startswith(f"warning: cache {mode.upper()}: ") and len(line) <= 120 and "\n" not in line


@pytest.mark.parametrize("record", [
    {"settled": True, "stopped": "settled", "batches": 3},
    {"settled": None, "stopped": "skipped: max_batches is 0", "batches": 0},
    {"settled": False, "stopped": "failed: HTTP 500", "batches": 0},  # its points say how, each on its line
])
def test_a_settled_skipped_or_failed_warm_up_prints_nothing(record):
    assert note("on", record) == ""


# --------------------------------------------------------------------------- the loop, on echo

ECHO = {"engine": {"kind": "echo", "block_size": 16}, "executor": "local", "dataset.prefix_len": 40,
        "dataset.suffix_len": 8, "dataset.output_len": 4, "sweep.num_requests": 4, "sweep.rates": [50],
        "sweep.engine_warmup": {"batch_requests": 4, "tolerance": 0.1, "max_batches": 6}}


def warm_up(monkeypatch, decode_ms: list[float], **sets) -> dict:
    """The record of a session's warm-up on echo, standing in for an engine that forms steps, whose
    per-token cost is ``decode_ms[k]`` in batch k (four requests a batch; the last value after)."""
    monkeypatch.setattr(session_module, "capabilities", lambda kind: Capabilities(shared_steps=True))
    calls = []
    generate = EchoEngine.generate

    async def timed(self, prompt, output_len, request_id, trace):
        k = min(len(calls) // 4, len(decode_ms) - 1)
        calls.append(request_id)
        self.config.decode_ms_per_token = decode_ms[k]
        return await generate(self, prompt, output_len, request_id, trace)

    monkeypatch.setattr(EchoEngine, "generate", timed)
    cfg = load_config(None, {**ECHO, **sets})

    async def go():
        async with ModeSession(cfg, "on", load_rows(cfg)) as s:
            return s.warmup

    record = asyncio.run(go())
    assert len(calls) == record["requests"]
    return record


def test_the_warm_up_runs_until_three_batches_agree(monkeypatch):
    record = warm_up(monkeypatch, [160, 80, 40])
    assert (record["settled"], record["stopped"], record["batches"], record["requests"]) == (True, "settled", 5, 20)
    assert [round(g, -1) for g in record["gap_ms"]] == [160, 80, 40, 40, 40]


def test_a_warm_up_that_never_settles_stops_at_its_cap_and_says_so(monkeypatch):
    record = warm_up(monkeypatch, [160, 120, 90, 60], **{"sweep.engine_warmup.max_batches": 4})
    assert (record["settled"], record["stopped"], record["batches"], record["requests"]) == \
        (False, "max_batches", 4, 16)
    assert note("on", record) == "warning: cache ON: the engine's step time did not settle in its warm-up " \
                                 "(still moving after 4 batches)"


def test_a_failed_warm_up_request_ends_the_warm_up(monkeypatch):
    record = warm_up(monkeypatch, [1000], **{"sweep.request_timeout_s": 0.5})
    assert (record["settled"], record["batches"], record["requests"]) == (False, 0, 4)
    assert record["stopped"] == "failed: unfinished: request_timeout_s (0.5 s) passed"


def test_echo_forms_no_steps_and_is_not_warmed_up():
    cfg = load_config(None, ECHO)

    async def go():
        async with ModeSession(cfg, "on", load_rows(cfg)) as s:
            return s.warmup

    assert asyncio.run(go()) == {"settled": None, "stopped": "skipped: engine.kind echo forms no engine steps to "
                                 "settle", "batches": 0, "requests": 0, "gap_ms": [], "s": 0.0}
