"""The simulator against schedules worked out by hand: vLLM's scheduler decides, the unit cost
model (1 ms + 0.01 ms per prompt token + 0.1 ms per decode token) prices each step."""

from __future__ import annotations

import pytest

from prefixstudy.sim.driver import SimRequest

PREFIX = list(range(1000, 1040))  # 40 shared tokens: two whole 16-token blocks and 8 over


def test_one_request_prefill_then_decodes(make_sim):
    sim = make_sim("on")
    tr = sim.run([SimRequest("a", list(range(100, 200)), 3, 0.0)])["a"]
    # step 1: the 100-token prompt, 1 + 1.0 = 2 ms, samples the first token; steps 2, 3: one decode, 1.1 ms
    assert tr.token_times == pytest.approx([0.002, 0.0031, 0.0042])
    assert tr.scheduled_s == 0.0 and tr.num_cached_tokens == 0
    assert [s["prefill_tokens"] for s in sim.steps] == [100, 0, 0]
    assert [s["decode_tokens"] for s in sim.steps] == [0, 1, 1]
    assert [s["context_tokens"] for s in sim.steps] == [100, 101, 102]
    assert [s["step_ms"] for s in sim.steps] == pytest.approx([2.0, 1.1, 1.1])


def test_idle_clock_jumps_to_the_next_arrival(make_sim):
    sim = make_sim("on")
    tr = sim.run([SimRequest("a", list(range(100, 110)), 1, 5.0)])["a"]
    assert tr.scheduled_s == 5.0
    assert tr.token_times == pytest.approx([5.0011])  # 1 ms + 10 prompt tokens
    assert len(sim.steps) == 1


def test_shared_prefix_hits_whole_blocks_only(make_sim):
    sim = make_sim("on")
    a = SimRequest("a", PREFIX + [1, 2, 3, 4, 5, 6, 7, 8], 2, 0.0)  # 48 tokens: three whole blocks
    b = SimRequest("b", PREFIX + list(range(2000, 2010)), 2, 1.0)  # shares blocks 0-1 (32 tokens)
    c = SimRequest("c", a.prompt_token_ids, 2, 2.0)  # all of a's 48 tokens, but the last one is
    tr = sim.run([a, b, c])  # always computed: the hit stops at the block before it, 32 tokens
    assert [tr[r].num_cached_tokens for r in "abc"] == [0, 32, 32]
    assert [s["prefill_tokens"] for s in sim.steps if s["prefill_tokens"]] == [48, 18, 16]
    assert tr["b"].token_times[0] == pytest.approx(1.0 + 0.00118)  # 1 ms + 18 uncached tokens


def test_caching_off_never_hits(make_sim):
    sim = make_sim("off")
    a = SimRequest("a", PREFIX + [1, 2, 3, 4, 5, 6, 7, 8], 2, 0.0)
    tr = sim.run([a, SimRequest("b", a.prompt_token_ids, 2, 1.0)])
    assert [tr[r].num_cached_tokens for r in "ab"] == [0, 0]
    assert sum(s["prefix_hits"] for s in sim.steps) == 0


def test_two_arrivals_in_one_step_batch_their_prefills(make_sim):
    sim = make_sim("on")
    tr = sim.run([SimRequest("a", list(range(100, 164)), 2, 0.0),
                  SimRequest("b", list(range(300, 364)), 2, 0.0)])
    # both 64-token prompts in one step: 1 + 1.28 = 2.28 ms; then one step decoding both: 1.2 ms
    assert tr["a"].token_times == pytest.approx([0.00228, 0.00348])
    assert tr["a"].token_times == tr["b"].token_times
    assert sim.steps[0]["num_prefill_reqs"] == 2 and sim.steps[1]["num_decode_reqs"] == 2


def test_eviction_with_a_tiny_block_pool(make_sim):
    """8 blocks (one is vLLM's null block: 7 usable).  a's 80-token prompt takes 5; b's 64 take
    the 2 never-used blocks and evict 2 of a's, last blocks first (vLLM frees a request's blocks
    in reverse order), so a's prompt again finds 3 blocks (48 tokens), not 4 (64)."""
    a = SimRequest("a", list(range(100, 180)), 1, 0.0)
    b = SimRequest("b", list(range(500, 564)), 1, 1.0)
    a2 = SimRequest("a2", a.prompt_token_ids, 1, 2.0)
    roomy = make_sim("on", num_gpu_blocks=64).run([a, b, a2])
    tiny = make_sim("on", num_gpu_blocks=8).run([a, b, a2])
    assert roomy["a2"].num_cached_tokens == 64
    assert tiny["a2"].num_cached_tokens == 48


def test_the_deadline_aborts_what_is_open(make_sim):
    sim = make_sim("on")
    tr = sim.run([SimRequest("a", list(range(100, 110)), 100, 0.0)], deadline_s=0.0105)
    # prefill 1.1 ms, then 1.1 ms per token: past 10.5 ms after 9 tokens, which are kept
    assert len(tr["a"].token_times) == 9
    assert not sim.sched.has_unfinished_requests()


def test_a_later_turn_arrives_after_its_parent_with_the_history(make_sim):
    """b is a's next turn: sent 0.5 s after a's last token, with a's 40-token prompt + a's 8
    generated ids + 10 new tokens.  a computed 47 tokens (its last sampled token has no KV yet), so
    two whole blocks of b's 58 are cached: 32 tokens hit, 26 are computed."""
    sim = make_sim("on")
    a = SimRequest("a", PREFIX, 8, 0.0)
    b = SimRequest("b", list(range(3000, 3010)), 1, float("nan"), parent="a", think_s=0.5)
    tr = sim.run([b, a])
    # a: prefill 1 + 0.4 = 1.4 ms, then 7 decodes of 1.1 ms: last token at 9.1 ms
    assert tr["a"].token_times[-1] == pytest.approx(0.0091)
    assert tr["b"].arrival_s == pytest.approx(0.5091) and tr["b"].scheduled_s == pytest.approx(0.5091)
    assert tr["b"].prompt_token_ids == PREFIX + [0] * 8 + list(range(3000, 3010))
    assert tr["b"].num_cached_tokens == 32
    assert tr["b"].token_times == pytest.approx([0.5091 + 0.00126])  # 1 ms + 26 uncached tokens


def test_a_later_turn_whose_parent_is_cut_is_never_sent(make_sim):
    sim = make_sim("on")
    tr = sim.run([SimRequest("a", PREFIX, 100, 0.0),
                  SimRequest("b", [5, 6, 7], 1, float("nan"), parent="a")], deadline_s=0.01)
    assert tr["b"].arrival_s == float("inf") and tr["b"].token_times == []
    assert not sim.sched.has_unfinished_requests()


def test_the_block_hash_memo_answers_as_the_hash_function_does():
    """MemoHash (sim.vllm_setup) stands between vLLM's request block hasher and its hash function:
    the same bytes for every key, the function called once per distinct key until the memo is full,
    then forgotten; a key it cannot hold goes straight to the function."""
    import hashlib
    import pickle

    from prefixstudy.sim.vllm_setup import MemoHash

    calls = []

    def sha(key):
        calls.append(key)
        return hashlib.sha256(pickle.dumps(key)).digest()

    memo = MemoHash(sha, limit=3)
    keys = [(b"p", (1, 2, 3), None), (b"p", (1, 2, 4), None), (b"q", (1, 2, 3), None)]
    assert [memo(k) for k in keys + keys] == [sha(k) for k in keys + keys]
    assert len(calls) == 3 + 6  # the memo's three, then the six direct checks
    calls.clear()
    memo((b"r", (5,), None))  # a fourth key: the full memo is emptied first
    assert len(memo.memo) == 1 and len(calls) == 1
    assert memo((b"p", (1,), [["unhashable"]])) == sha((b"p", (1,), [["unhashable"]]))
