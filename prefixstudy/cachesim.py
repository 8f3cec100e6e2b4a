"""Beside the runner: what a block-level prefix cache should serve, computed from the requests sent.

``BlockCache`` follows vLLM v1's block pool as seen from outside:

* a prompt is looked up block by block (chained hashes of whole blocks); the hit stops at the
  first missing block and never covers the prompt's last token (vLLM always computes it);
* a request holds ceil((prompt + output - 1) / block) blocks: every token but the last sampled one
  has KV; each full block gets the hash of its tokens (prompt and generated);
* new blocks are taken from the head of the free queue, evicting whatever was cached there;
* a finished request's blocks are freed in reverse order (vLLM's ``free(reversed(blocks))``):
  hashed (full) blocks go to the free queue's tail, so its tail blocks are evicted before its
  prefix; blocks without a hash (the partial last one) go to the head, reused first (vLLM's
  ``BlockPool.free_blocks``, 0.32: LIFO for uncached blocks, LRU for cached ones);
* one block of ``num_blocks`` is vLLM's reserved null block.

Assumption (stated in the report): each request runs alone, in send order, so blocks pinned by
requests in flight at the same time are ignored.  That is exact when the engine runs one request
at a time (``max_num_seqs: 1``) and an upper bound on what survives otherwise.  ``num_blocks=None``
is the infinite cache: the upper bound the hit-rate check's "expected" stands for.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class SentRequest:
    """One request as the engine saw it: its prompt and the tokens it generated (ids, or only
    their number when the backend did not return ids: such blocks then match nothing)."""

    prompt_token_ids: Sequence[int]
    output_token_ids: Sequence[int] | None = None
    output_len: int = 0


def block_hashes(tokens: Sequence[int], block: int) -> list[int]:
    """Chained hashes of the whole blocks of ``tokens`` (a block's hash names everything before it)."""
    out, h = [], 0
    for end in range(block, len(tokens) + 1, block):
        h = hash((h, tuple(tokens[end - block:end])))
        out.append(h)
    return out


class BlockCache:
    """vLLM's block pool, one request at a time.  ``run(prompt, output)`` returns the prompt tokens
    served from the cache and leaves the request's blocks cached."""

    def __init__(self, block_size: int, num_blocks: int | None = None):
        self.block = block_size
        # One block is vLLM's null block; never fewer than one usable.
        self.capacity = None if num_blocks is None else max(1, num_blocks - 1)
        self.clear()

    def clear(self) -> None:
        """Forget every block (vLLM's ``reset_prefix_cache`` on an idle engine)."""
        self.free: OrderedDict[int, int | None] = OrderedDict()  # slot -> hash, head evicted first
        self.slots_of: dict[int, set[int]] = {}  # hash -> slots holding it
        self.next_slot = 0
        self.evicted_blocks = 0
        self._unique = 0  # stands in for generated tokens whose ids are unknown
        self._held: dict[int, int | None] = {}  # slots of the running request -> their hash

    def lookup(self, prompt: Sequence[int]) -> int:
        """Whole cached blocks at the start of ``prompt`` (tokens), the last prompt token excluded."""
        hit = 0
        for h in block_hashes(prompt[:max(0, len(prompt) - 1)], self.block):
            if not self.slots_of.get(h):
                break
            hit += 1
        return hit * self.block

    def run(self, prompt: Sequence[int], output: Sequence[int] | None = None, output_len: int = 0) -> int:
        if output is None:
            self._unique += 1
            output = [-self._unique] * max(1, output_len)  # negative ids: no real block matches them
        hit = self.lookup(prompt)
        tokens = list(prompt) + list(output[:-1])
        hashes = block_hashes(tokens, self.block)
        n_blocks = -(-len(tokens) // self.block)
        slots = [self._take(hashes[i]) for i in range(hit // self.block)]
        for i in range(hit // self.block, n_blocks):
            slots.append(self._new(hashes[i] if i < len(hashes) else None))
        for s in reversed(slots):
            if s < 0:
                continue
            h = self.free[s] = self._held.pop(s)
            if h is None:  # never matches a lookup: reused first
                self.free.move_to_end(s, last=False)
        return hit

    # ------------------------------------------------------------------ slots

    def _take(self, h: int) -> int:
        s = next(iter(self.slots_of[h]))
        self._held[s] = self.free.pop(s, h)
        return s

    def _new(self, h: int | None) -> int:
        if self.capacity is None or self.next_slot < self.capacity:
            s, self.next_slot = self.next_slot, self.next_slot + 1
        elif self.free:
            s, old = self.free.popitem(last=False)
            if old is not None:
                self.slots_of[old].discard(s)
                self.evicted_blocks += 1
        else:  # a request larger than the whole cache: vLLM would refuse it; count it as uncached
            return -1
        self._held[s] = h
        if h is not None:
            self.slots_of.setdefault(h, set()).add(s)
        return s


def simulate(requests: Iterable[SentRequest], block_size: int, num_blocks: int | None = None) -> tuple[list[int], int]:
    """Cached prompt tokens per request, in the order given, and the blocks evicted meanwhile."""
    cache = BlockCache(block_size, num_blocks)
    hits = [cache.run(r.prompt_token_ids, r.output_token_ids, r.output_len) for r in requests]
    return hits, cache.evicted_blocks
