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

With ``tier_blocks`` a CPU tier sits under the pool, as vLLM 0.26's OffloadingConnector (native
CPU offloading, ``kv_offloading_size``) keeps one (``OffloadTier``; source references there):
after the pool's hit, the tier is looked up from where the pool stopped, and what it serves is
loaded into the pool's blocks, which are then cached there as computed ones.

Two replays.  ``simulate``: each request alone, in send order; with ``num_blocks=None`` (an
infinite cache) that is the upper bound the hit-rate check's "expected" stands for.
``simulate_timed``: each request holds its blocks from when the engine scheduled it to its last
token, so requests in flight together pin blocks and the cache gets only the rest of the pool;
that is the capacity-aware estimate.  Assumptions (stated in the report): a request takes all its
blocks when scheduled (vLLM takes decode blocks as it goes), its prompt's blocks are cached from
that moment (vLLM: once computed), and preemption is not modelled.  At ``max_num_seqs: 1`` both
are exact.
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


def block_hashes(tokens: Sequence[int], block: int, salt: str = "") -> list[int]:
    """Chained hashes of the whole blocks of ``tokens`` (a block's hash names everything before it).
    A ``salt`` enters the first block's hash, so the chain, as vLLM's per-request ``cache_salt``:
    prompts under different salts share no block."""
    out, h = [], hash(("cache_salt", salt)) if salt else 0
    for end in range(block, len(tokens) + 1, block):
        h = hash((h, tuple(tokens[end - block:end])))
        out.append(h)
    return out


def tier_blocks_for(size_gib: float, kv_bytes_per_block: int, blocks_per_chunk: int = 1) -> int:
    """Offload blocks in a CPU tier of ``size_gib``: vLLM's ``CPUOffloadingSpec`` divides
    ``cpu_bytes_to_use`` (``kv_offloading_size`` GiB) by the bytes of one offload block, which is
    ``blocks_per_chunk`` GPU blocks of every layer on every worker (vllm/v1/kv_offload/cpu/spec.py,
    ``num_blocks = cpu_bytes_to_use // aligned_kv_bytes_per_chunk``)."""
    per = kv_bytes_per_block * blocks_per_chunk
    return int(size_gib * (1 << 30)) // per if per > 0 else 0


class OffloadTier:
    """vLLM 0.26's native CPU tier (``CPUOffloadingManager`` with its default ``LRUCachePolicy``,
    vllm/v1/kv_offload/cpu/manager.py and policies/lru.py), in offload blocks of one GPU block each
    (``blocks_per_chunk`` 1, the default: offloading/config.py ``build_offloading_config``):

    * only whole prompt blocks are stored (``offload_prompt_only`` defaults to True,
      kv_offload/base.py), every one the request computed or hit, unless already stored
      (``prepare_store`` skips present keys); a new block goes to the LRU tail;
    * when full, the LRU head is evicted, never a block of the request being stored
      (``evict(n, protected)``); a store that cannot fit is dropped whole (``prepare_store``
      returns None);
    * a lookup starts where the GPU pool's hit stopped and counts consecutive present blocks; it may
      cover the whole prompt, its last token included (offloading/scheduler.py ``_lookup``:
      ``max_hit_size_tokens = num_tokens`` for full attention); vLLM then recomputes the last token
      (core/sched/scheduler.py ``_update_waiting_for_remote_kv``) but counts it cached
      (``prefill_stats.set`` at schedule time), so this model counts it too;
    * a lookup touches every block of the request present in the tier (``_touch`` ->
      ``LRUCachePolicy.touch``: in reverse, so the prefix ends most recently used).

    Not modelled: stores land asynchronously (a lookup of a block still being written waits, as
    ``HIT_PENDING``); loaded blocks re-enter the LRU order when their load completes, in an order
    vLLM takes from a set.  ``capacity`` None: unbounded."""

    def __init__(self, capacity: int | None):
        self.capacity = capacity
        self.blocks: OrderedDict[int, None] = OrderedDict()  # head evicted first
        self.evicted_blocks = 0

    def lookup(self, hashes: Sequence[int], start: int) -> int:
        """Consecutive present blocks of ``hashes`` (the whole prompt's) from block ``start``."""
        n = 0
        for h in hashes[start:]:
            if h not in self.blocks:
                break
            n += 1
        return n

    def touch(self, hashes: Sequence[int]) -> None:
        for h in reversed(hashes):
            if h in self.blocks:
                self.blocks.move_to_end(h)

    def store(self, hashes: Sequence[int]) -> None:
        new = [h for h in dict.fromkeys(hashes) if h not in self.blocks]
        if not new:
            return
        if self.capacity is not None:
            over = len(self.blocks) + len(new) - self.capacity
            mine = set(hashes)
            victims = [h for h in self.blocks if h not in mine][:max(0, over)]
            if len(victims) < over:
                return  # vLLM drops the whole store ("cannot store chunks")
            for h in victims:
                del self.blocks[h]
            self.evicted_blocks += len(victims)
        for h in new:
            self.blocks[h] = None


class BlockCache:
    """vLLM's block pool.  ``start(prompt, output)`` looks the prompt up and takes the request's
    blocks (returns the cached prompt tokens and the blocks held); ``finish(blocks)`` frees them.
    ``run`` is both at once: one request alone.  ``tier_blocks``: a CPU tier under the pool
    (``OffloadTier``; 0: none, None: unbounded); ``last_tier_hit`` is the part of the last
    ``start``'s hit the tier served (tokens)."""

    def __init__(self, block_size: int, num_blocks: int | None = None, tier_blocks: int | None = 0):
        self.block = block_size
        # One block is vLLM's null block; never fewer than one usable.
        self.capacity = None if num_blocks is None else max(1, num_blocks - 1)
        self.tier_blocks = tier_blocks
        self.clear()

    def clear(self) -> None:
        """Forget every block (vLLM's ``reset_prefix_cache`` on an idle engine)."""
        self.free: OrderedDict[int, None] = OrderedDict()  # free slots, head evicted first
        self.hash_of: dict[int, int | None] = {}  # slot -> the hash of the block it holds
        self.slots_of: dict[int, set[int]] = {}  # hash -> slots holding it
        self.refs: dict[int, int] = {}  # slot -> running requests holding it
        self.next_slot = 0
        self.evicted_blocks = 0
        self.tier = OffloadTier(self.tier_blocks) if self.tier_blocks != 0 else None
        self.last_tier_hit = 0
        self._unique = 0  # stands in for generated tokens whose ids are unknown

    def lookup(self, prompt: Sequence[int], salt: str = "") -> int:
        """Whole cached blocks at the start of ``prompt`` (tokens), the last prompt token excluded."""
        hit = 0
        for h in block_hashes(prompt[:max(0, len(prompt) - 1)], self.block, salt):
            if not self.slots_of.get(h):
                break
            hit += 1
        return hit * self.block

    def run(self, prompt: Sequence[int], output: Sequence[int] | None = None, output_len: int = 0,
            salt: str = "") -> int:
        hit, slots = self.start(prompt, output, output_len, salt)
        self.finish(slots)
        return hit

    def start(self, prompt: Sequence[int], output: Sequence[int] | None = None,
              output_len: int = 0, salt: str = "") -> tuple[int, list[int]]:
        if output is None:
            self._unique += 1
            output = [-self._unique] * max(1, output_len)  # negative ids: no real block matches them
        hit = self.lookup(prompt, salt)
        tokens = list(prompt) + list(output[:-1])
        hashes = block_hashes(tokens, self.block, salt)
        n_blocks = -(-len(tokens) // self.block)
        slots = [self._take(hashes[i]) for i in range(hit // self.block)]
        for i in range(hit // self.block, n_blocks):
            slots.append(self._new(hashes[i] if i < len(hashes) else None))
        self.last_tier_hit = 0
        if self.tier is not None:
            # Whole prompt blocks share their hashes with the request's: the prompt is its head.
            prompt_hashes = hashes[:len(prompt) // self.block]
            self.last_tier_hit = self.tier.lookup(prompt_hashes, hit // self.block) * self.block
            self.tier.touch(prompt_hashes)
            self.tier.store(prompt_hashes)
        return hit + self.last_tier_hit, slots

    def finish(self, slots: list[int]) -> None:
        """Free a request's blocks, its tail first: full (hashed) blocks to the free queue's tail,
        partial ones to its head."""
        for s in reversed(slots):
            if s not in self.refs:  # -1 (never got a block), or the pool was cleared meanwhile
                continue
            self.refs[s] -= 1
            if self.refs[s]:
                continue  # another running request still holds it
            del self.refs[s]
            self.free[s] = None
            if self.hash_of.get(s) is None:  # never matches a lookup: reused first
                self.free.move_to_end(s, last=False)

    # ------------------------------------------------------------------ slots

    def _take(self, h: int) -> int:
        s = next(iter(self.slots_of[h]))
        self.free.pop(s, None)
        self.refs[s] = self.refs.get(s, 0) + 1
        return s

    def _new(self, h: int | None) -> int:
        if self.capacity is None or self.next_slot < self.capacity:
            s, self.next_slot = self.next_slot, self.next_slot + 1
        elif self.free:
            s, _ = self.free.popitem(last=False)
            old = self.hash_of.pop(s, None)
            if old is not None:
                self.slots_of[old].discard(s)
                self.evicted_blocks += 1
        else:  # every block is held by running requests: vLLM would make this one wait or preempt
            return -1
        self.refs[s] = 1
        self.hash_of[s] = h
        if h is not None:
            self.slots_of.setdefault(h, set()).add(s)
        return s


def simulate(requests: Iterable[SentRequest], block_size: int, num_blocks: int | None = None,
             tier_blocks: int | None = 0) -> tuple[list[int], int]:
    """Cached prompt tokens per request (pool and tier), each alone, in the order given; and the
    pool's blocks evicted."""
    cache = BlockCache(block_size, num_blocks, tier_blocks)
    hits = [cache.run(r.prompt_token_ids, r.output_token_ids, r.output_len) for r in requests]
    return hits, cache.evicted_blocks


def simulate_timed(requests: Sequence[tuple[float, float, SentRequest]], block_size: int,
                   num_blocks: int | None = None, tier_blocks: int | None = 0) -> tuple[list[int], int]:
    """As ``simulate``, but each request holds its blocks from its start (when the engine scheduled
    it) to its end (its last token), so requests in flight together pin their blocks and leave the
    rest of the pool to the cache.  ``requests``: (start, end, request); results in that order.
    At equal times, ends come first.  A request's blocks are all taken at its start (vLLM takes
    decode blocks as it goes: this errs towards pinning more)."""
    cache = BlockCache(block_size, num_blocks, tier_blocks)
    events = sorted([(end, 0, k) for k, (_, end, _) in enumerate(requests)]
                    + [(start, 1, k) for k, (start, _, _) in enumerate(requests)])
    hits, held = [0] * len(requests), {}
    for _, is_start, k in events:
        if is_start:
            r = requests[k][2]
            hits[k], held[k] = cache.start(r.prompt_token_ids, r.output_token_ids, r.output_len)
        elif k in held:
            cache.finish(held.pop(k))
    return hits, cache.evicted_blocks
