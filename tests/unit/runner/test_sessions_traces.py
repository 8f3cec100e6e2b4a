"""The runner on the echo backend with the new workloads: later turns wait for their parents and
carry their real generated tokens, trace replay keeps its recorded shape, and a bounded cache's
eviction is estimated exactly and reported, not failed."""

from __future__ import annotations

from pathlib import Path

import pytest

from prefixstudy.engines.echo import EchoEngine
from prefixstudy.results import load
from prefixstudy.study.orchestrate import run_study
from tests.unit.runner.test_runner import cfg_with, run_point

FIXTURE = Path(__file__).resolve().parents[2] / "data" / "mooncake_synthetic.jsonl"
SESSIONS = {"dataset.kind": "sessions", "dataset.prefix_len": 32, "dataset.suffix_len": 8, "dataset.output_len": 8,
            "dataset.sessions": {"turns": 3, "user_len": 8, "think_time_s": 0.05}, "sweep.num_requests": 6,
            "sweep.warmup_requests": 0, "engine.decode_ms_per_token": 2.0}


def test_later_turns_wait_for_their_parent_and_reuse_its_history():
    res = run_point(cfg_with(**SESSIONS), "on", 50.0)
    m = res.requests
    assert m["session"].tolist() == [0, 0, 0, 1, 1, 1] and m["turn"].tolist() == [0, 1, 2, 0, 1, 2]
    assert m["parent_index"].tolist() == [-1, 0, 1, -1, 3, 4]
    # 40, then 40 + 8 out + 8 new = 56, then 56 + 8 + 8 = 72 prompt tokens.
    assert m["prompt_tokens"].tolist() == [40, 56, 72] * 2
    # Primed 32-token system prompt; turn k reuses every whole block of turn k-1's prompt + output.
    assert m["num_cached_tokens"].tolist() == [32, 32, 48] * 2 == m["expected_cached_tokens"].tolist()
    assert m["estimated_cached_tokens"].tolist() == [32, 32, 48] * 2
    by = m.set_index("request_index")
    for i in (1, 2, 4, 5):  # sent think time after the parent's last token, not on the arrival schedule
        parent_end_s = by.loc[i - 1, "sent_s"] + by.loc[i - 1, "e2e_ms"] / 1e3
        assert by.loc[i, "scheduled_s"] == pytest.approx(parent_end_s + 0.05, abs=2e-3)
        assert by.loc[i, "sent_s"] >= by.loc[i, "scheduled_s"]
    # Sessions start on the arrival schedule (constant 50/s: session 1 at 0.02 s).
    assert by.loc[3, "scheduled_s"] == pytest.approx(0.02)


def test_a_turn_whose_parent_failed_is_a_row_not_sent(monkeypatch):
    real = EchoEngine.generate

    async def fail_first_turns(self, prompt, n, rid, trace):
        if len(prompt) == 40:
            raise RuntimeError("boom")
        return await real(self, prompt, n, rid, trace)

    monkeypatch.setattr(EchoEngine, "generate", fail_first_turns)
    m = run_point(cfg_with(**{**SESSIONS, "sweep.prime_prefixes": False}), "on", 50.0).requests
    assert m["error"].tolist()[:3] == ["RuntimeError: boom",
                                       "parent failed: not sent, its parent did not finish (RuntimeError: boom)",
                                       "parent failed: not sent, its parent did not finish (parent failed: not sent, "
                                       "its parent did not finish (RuntimeError: boom))"]
    assert m["sent_s"].isna().tolist() == [False, True, True] * 2


def test_trace_replay_sends_at_scaled_recorded_times_and_hits_by_hash_ids():
    cfg = cfg_with(**{"dataset.kind": "trace", "dataset.path": str(FIXTURE), "engine.block_size": 128,
                      "sweep.num_requests": 8, "sweep.warmup_requests": 0, "sweep.prime_prefixes": False,
                      "engine.max_model_len": 2048})
    m = run_point(cfg, "on", 20.0).requests
    assert m["scheduled_s"].tolist() == pytest.approx([t * (7 / 20) / 1.5 for t in [0, .2, .45, .6, .9, 1., 1.3, 1.5]])
    # Shared whole 128-token blocks from the hash ids (512 tokens each), never a prompt's last token.
    assert m["num_cached_tokens"].tolist() == [0, 896, 512, 0, 1024, 512, 1024, 0] == m["expected_cached_tokens"].tolist()


@pytest.mark.slow
def test_a_cache_too_small_is_eviction_in_the_estimate_not_a_failure(tmp_path):
    # 6 groups of 2 blocks, round robin, 1 request at a time: 14 blocks fit them, 12 do not.
    base = {"dataset.kind": "groups", "dataset.groups": 6, "dataset.prefix_len": 32, "dataset.suffix_len": 4,
            "dataset.output_len": 2, "sweep.num_requests": 12, "sweep.warmup_requests": 0, "sweep.modes": ["on"],
            "sweep.rates": [50], "out": str(tmp_path)}
    fits = load(run_study(cfg_with(**base, **{"engine.num_blocks": 14}), progress=False))
    thrash = load(run_study(cfg_with(**base, **{"engine.num_blocks": 12}), progress=False))
    assert fits.measured["num_cached_tokens"].tolist() == [32] * 12
    # Priming 6 x 2 blocks into 11 usable evicted group 0's second block (a request's tail goes
    # first); from then on LRU evicts each prefix just before it comes back.
    assert thrash.measured["num_cached_tokens"].tolist() == [16] + [0] * 11
    assert thrash.measured["estimated_cached_tokens"].tolist() == [16] + [0] * 11
    assert thrash.measured["expected_cached_tokens"].tolist() == [32] * 12
    s = thrash.summary.iloc[0]
    assert (s["hit_rate_measured"], s["hit_rate_estimated"]) == (16 / 432, 16 / 432)
    assert s["hit_rate_expected"] == pytest.approx(32 / 36)
    assert bool(s["hit_rate_ok"]) and thrash.manifest["points"][0]["num_blocks"] == 12
    # The cold-start probe's 2 whole blocks (runner.cold), 12 primed and 23 new hashed blocks (one
    # was a hit) went in; 10 are left.
    assert thrash.manifest["points"][0]["evicted_blocks_estimated"] == 2 + 12 + 23 - 10
