"""The block-cache estimate: vLLM's block pool seen from outside, exact on small cases worked by hand."""

from prefixstudy.engines.cachesim import BlockCache, SentRequest, block_hashes, simulate


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
    from prefixstudy.engines.cachesim import simulate_timed

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


# ----------------------------------------------------------------- the CPU tier (vLLM's OffloadingConnector)

def test_a_tier_serves_the_whole_prompt_the_pool_stops_one_token_short_of():
    # 8 tokens = 2 whole blocks of 4: the pool never serves the last token's block; the tier's
    # lookup covers the whole prompt (vLLM counts it cached and recomputes the last token).
    a = list(range(8))
    assert simulate([req(a), req(a)], 4, None) == ([0, 4], 0)
    assert simulate([req(a), req(a)], 4, None, tier_blocks=None) == ([0, 8], 0)


def test_the_tier_holds_what_the_pool_evicted_while_it_fits():
    # 4-token blocks, 5 = 4 usable; two groups of 8 shared + 4 unique tokens (3 blocks a request)
    # alternate.  Worked by hand: group 1 evicts group 0's second block and suffix from the pool,
    # so group 0 comes back to 1 block in the pool (4 tokens); the tier, 6 blocks (both groups'
    # 3), serves its second block too (8).  A 3-block tier holds only the last request's blocks.
    reqs = [req([g] * 8 + [100 + i] * 4) for i, g in enumerate([0, 1, 0, 1])]
    assert simulate(reqs, 4, 5) == ([0, 0, 4, 4], 6)
    assert simulate(reqs, 4, 5, tier_blocks=6) == ([0, 0, 8, 8], 6)
    assert simulate(reqs, 4, 5, tier_blocks=3) == ([0, 0, 4, 4], 6)


def test_a_store_larger_than_the_tier_is_dropped_whole():
    c = BlockCache(4, None, tier_blocks=2)
    assert c.run(list(range(13))) == 0  # 3 whole prompt blocks do not fit in 2: nothing stored
    assert len(c.tier.blocks) == 0
    c = BlockCache(4, None, tier_blocks=3)
    c.run(list(range(13)))
    assert len(c.tier.blocks) == 3


def test_start_says_which_part_the_tier_served():
    c = BlockCache(4, 3, tier_blocks=None)  # 2 usable pool blocks
    c.run([1] * 8)
    c.run([2] * 8)  # evicts both of [1]*8's blocks from the pool
    hit, slots = c.start([1] * 8)
    assert (hit, c.last_tier_hit) == (8, 8)


def test_tier_blocks_from_the_tier_size_as_vllm_divides_it():
    from prefixstudy.engines.cachesim import tier_blocks_for

    # Mistral-7B in bf16, 16-token blocks: 2 (K, V) x 32 layers x 8 KV heads x 128 x 2 bytes x 16.
    per_block = 2 * 32 * 8 * 128 * 2 * 16
    assert per_block == 2 << 20
    assert (tier_blocks_for(32, per_block), tier_blocks_for(8, per_block)) == (16384, 4096)
    assert tier_blocks_for(8, per_block, blocks_per_chunk=2) == 2048
