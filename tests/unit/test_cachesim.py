"""The block-cache estimate: vLLM's block pool seen from outside, exact on small cases worked by hand."""

from prefixstudy.cachesim import BlockCache, SentRequest, block_hashes, simulate


def req(prompt, out_len=1, out=None):
    return SentRequest(prompt, out, out_len)


def test_infinite_cache_serves_whole_shared_blocks_never_the_last_token():
    a = list(range(100, 140))
    hits, evicted = simulate([req(a), req(a), req(a[:32]), req(a[:16] + [7] * 24), req([7] * 16 + a[16:])], 16)
    # 40 tokens = 2 whole blocks; a 32-token prompt may reuse only 16 (its last token is computed).
    assert (hits, evicted) == ([0, 32, 16, 16, 0], 0)


def test_generated_tokens_fill_blocks_a_later_prompt_can_reuse():
    c = BlockCache(16)
    p = list(range(100, 120))  # 20 tokens; with 13 generated, tokens 0..31 have KV: 2 whole blocks
    out = list(range(500, 513))
    assert c.run(p, out) == 0
    assert c.run(p + out + [9] * 5) == 32


def test_round_robin_groups_fit_then_thrash_at_one_block_too_few():
    # Worked by hand: 2-block prefixes + 16-token suffixes + 8 output tokens, 128-token blocks, as
    # the engine test runs them.  Each request keeps 2 hashed blocks (LRU) and one partial block
    # (reused first).  12 blocks = 11 usable: 5 groups fit (10 + 1), 6 do not (12 + 1).
    pre = [[g] * 256 for g in range(6)]

    def run(groups, blocks):
        return simulate([req(pre[i % groups] + [1000 + i] * 16, 8) for i in range(2 * groups)], 128, blocks)

    assert run(5, 12) == ([0] * 5 + [256] * 5, 0)
    hits, evicted = run(6, 12)
    # LRU evicts each prefix just before it comes back: 24 hashed blocks went in, 10 are left.
    assert hits == [0] * 12 and evicted == 14
    assert run(6, 14) == ([0] * 6 + [256] * 6, 0)


def test_block_hashes_chain_on_everything_before():
    assert block_hashes([1] * 32, 16)[1] != block_hashes([2] * 16 + [1] * 16, 16)[1]
    assert len(block_hashes(list(range(47)), 16)) == 2


def test_unknown_outputs_never_match():
    c = BlockCache(4)
    assert c.run([1, 2, 3, 4, 5], None, 8) == 0
    assert c.run([1, 2, 3, 4, 5, 6, 7, 8, 9, 10]) == 4  # the prompt's block only


def test_requests_in_flight_pin_their_blocks_and_push_the_cache_out():
    from prefixstudy.cachesim import simulate_timed

    # 4-token blocks, 4 usable.  W runs long (t 0..10) holding 2 blocks; X runs (1..2) and is freed;
    # Z (3..4) needs 2 blocks.  Alone in turn, W's freed blocks would be the oldest and go first,
    # so X's first block survives; with W still running, only X's blocks are free, and both go.
    w, x, z = [1] * 8, [2] * 8, [3] * 8
    reqs = [(0, 10, req(w)), (1, 2, req(x)), (3, 4, req(z)), (5, 6, req(x))]
    # Evicted: alone, W's 2 blocks, then X's second block when X comes back (the lookup stops one
    # token short, so X takes a new block for it); in flight, X's 2 blocks, then Z's 2.
    assert simulate([r for _, _, r in reqs], 4, 5) == ([0, 0, 0, 4], 3)
    assert simulate_timed(reqs, 4, 5) == ([0, 0, 0, 0], 4)
    # With room for everything, timing changes nothing.
    assert simulate_timed(reqs, 4, None) == ([0, 0, 0, 4], 0)
