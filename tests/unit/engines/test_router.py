"""prefixstudy.engines.router: every policy's decisions as exact sequences."""

from __future__ import annotations

import pytest

from prefixstudy.engines.router import HashRing, Router, prefix_key

A = [7, 7, 7, 7, 1]  # one block of 4 tokens, then a suffix
A2 = [7, 7, 7, 7, 2]  # the same first block, another suffix


def test_round_robin_order_counts_every_request_and_resets_per_point():
    r = Router(3, "round_robin")
    assert [r.pick(A) for _ in range(5)] == [0, 1, 2, 0, 1]
    r.reset()
    assert [r.pick(A) for _ in range(2)] == [0, 1]


def test_least_loaded_ties_rotate_after_the_last_pick():
    r = Router(3, "least_loaded")
    assert [r.pick(A), r.pick(A)] == [0, 1]  # idle fleet: in turn, not all on replica 0
    r.done(0)
    # In flight [0, 1, 0]; scanning from replica 2 (after the last pick): 2 and 0 tie, 2 comes first.
    assert r.pick(A) == 2
    assert r.pick(A) == 0  # [0, 1, 1] -> the only idle one
    assert r.in_flight == [1, 1, 1]
    r.done(1)
    assert r.pick(A) == 1


def test_affinity_keeps_a_prefix_on_one_replica():
    r = Router(3, "prefix_affinity", block_size=4, prefix_blocks=1)
    owners = []
    for g in range(6):  # six prefixes, each sent twice with other suffixes, one at a time
        for suffix in (1, 2):
            owners.append(r.pick([g] * 4 + [suffix]))
            r.done(owners[-1])
    assert owners == [0, 0, 1, 1, 0, 0, 2, 2, 0, 0, 2, 2]
    assert r.spills == 0


def test_affinity_spills_exactly_when_the_bound_is_crossed():
    # Two replicas, bound 1.0: the owner may hold ceil((in flight + 1) / 2) with the new request.
    r = Router(2, "prefix_affinity", block_size=4, prefix_blocks=1, load_bound=1.0)
    assert r.ring.owner(prefix_key(A, 4, 1)) == 0
    assert r.pick(A) == 0  # in flight [0, 0]: 1 <= ceil(1/2) = 1
    assert r.bound() == 1 and r.pick(A2) == 1  # [1, 0]: 2 > ceil(2/2) = 1 -> spill to the least loaded
    assert r.bound() == 2 and r.pick(A) == 0  # [1, 1]: 2 <= ceil(3/2) = 2 -> stays
    assert r.pick(A) == 1 and r.spills == 2  # [2, 1]: 3 > ceil(4/2) = 2 -> spill
    r.done(1)
    r.done(1)
    assert r.pick(A) == 1 and r.in_flight == [2, 1]  # [2, 0]: 3 > ceil(3/2) = 2 -> spill
    r.done(0)
    assert r.pick(A) == 0 and r.spills == 3  # [1, 1]: 2 <= ceil(3/2) = 2 -> back on its owner


def test_affinity_never_spills_when_the_bound_allows_everything():
    r = Router(2, "prefix_affinity", block_size=4, prefix_blocks=1, load_bound=2.0)
    assert [r.pick(A) for _ in range(10)] == [0] * 10 and r.spills == 0


def test_prefix_key_hashes_whole_blocks_only():
    assert prefix_key([1, 2, 3, 4, 5], 4, 1) == prefix_key([1, 2, 3, 4, 9, 9], 4, 1)
    assert prefix_key([1, 2, 3, 4, 5], 4, 2) == prefix_key([1, 2, 3, 4, 6], 4, 2)  # one whole block only
    assert prefix_key([1, 2, 3], 4, 1) != prefix_key([1, 2, 4], 4, 1)  # shorter than a block: whole prompt


def test_consistent_hashing_moves_few_keys_when_a_replica_is_added():
    four, five = HashRing(4), HashRing(5)
    keys = [prefix_key([g, 1, 2, 3], 4, 1) for g in range(1000)]
    moved = [k for k in keys if four.owner(k) != five.owner(k)]
    assert len(moved) == 190  # about 1/5, the new replica's share; mod-N hashing would move ~4/5
    assert {five.owner(k) for k in moved} == {4}  # and only to the new replica
    assert [sum(four.owner(k) == r for k in keys) for r in range(4)] == [279, 318, 201, 202]


def test_unknown_policy_is_refused():
    with pytest.raises(ValueError, match="unknown routing policy 'random'"):
        Router(2, "random")
