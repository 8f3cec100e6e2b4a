"""Stage: routing.  Which replica of a mode's fleet gets a request: pure decisions, no IO, no clock.

The fleet (``engines.fleet``) asks ``Router.pick`` for every request it is given (primes and
warm-ups too: the fleet is one black box behind its router) and tells it when the request is done;
the router only counts requests in flight per replica.  Policies:

- ``round_robin``: replica k mod N for the k-th request since the last ``reset``.
- ``least_loaded``: fewest requests in flight; ties go to the first replica in round-robin order
  after the one picked last (so an idle fleet is still served in turn, not all by replica 0).
- ``prefix_affinity``: a consistent hash of the prompt's first ``prefix_blocks`` whole blocks
  (a ring with ``VNODES`` points per replica), so one prefix stays on one replica and a change of N
  moves few keys; with a load bound (consistent hashing with bounded loads): when the owner would
  hold more than ``ceil(load_bound x (in flight + 1) / N)`` requests with this one, the request
  spills to the least-loaded replica.

Every decision is a function of the prompt and the in-flight counts, so a sequence of requests
and completions gives one exact sequence of replicas (the tests check them).
"""

from __future__ import annotations

import bisect
import hashlib
import math
from typing import Literal, Sequence

POLICIES = ("round_robin", "least_loaded", "prefix_affinity")
Policy = Literal["round_robin", "least_loaded", "prefix_affinity"]
VNODES = 64  # ring points per replica: with 64, each replica's share of keys is within ~±15 % of 1/N


def _h64(data: bytes) -> int:
    """A stable 64-bit hash (Python's hash() of str is salted per process)."""
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


def prefix_key(prompt: Sequence[int], block_size: int, prefix_blocks: int) -> int:
    """The affinity key: a hash of the first ``prefix_blocks`` whole blocks of the prompt (what
    the prefix cache can share); a prompt shorter than one block hashes whole."""
    whole = min(prefix_blocks, len(prompt) // block_size) * block_size
    toks = prompt[:whole] if whole else prompt
    return _h64(b",".join(str(int(t)).encode() for t in toks))


class HashRing:
    """Consistent hashing over replicas 0..n-1: a key belongs to the first replica point at or
    after it on the ring (wrapping around)."""

    def __init__(self, n: int, vnodes: int = VNODES):
        points = sorted((_h64(f"replica-{r}-{v}".encode()), r) for r in range(n) for v in range(vnodes))
        self.hashes = [h for h, _ in points]
        self.owners = [r for _, r in points]

    def owner(self, key: int) -> int:
        i = bisect.bisect_left(self.hashes, key)
        return self.owners[i % len(self.owners)]


class Router:
    """One mode's router over ``n`` replicas.  ``pick`` counts the request in flight on the replica
    it returns; ``done`` takes it off again."""

    def __init__(self, n: int, policy: Policy = "round_robin", block_size: int = 16, prefix_blocks: int = 4,
                 load_bound: float = 1.25):
        if policy not in POLICIES:
            raise ValueError(f"unknown routing policy {policy!r}; one of {', '.join(POLICIES)}")
        self.n, self.policy, self.block_size = n, policy, block_size
        self.prefix_blocks, self.load_bound = prefix_blocks, load_bound
        self.ring = HashRing(n)
        self.reset()

    def reset(self) -> None:
        """A new point: nothing in flight, round robin from replica 0, no spills counted."""
        self.in_flight = [0] * self.n
        self.next_rr = 0
        self.spills = 0

    def _least_loaded(self) -> int:
        # Scan in round-robin order from next_rr, so ties rotate.
        order = [(self.next_rr + k) % self.n for k in range(self.n)]
        return min(order, key=lambda r: self.in_flight[r])

    def bound(self) -> int:
        """The most requests the affinity owner may hold with the next one (bounded loads)."""
        return math.ceil(self.load_bound * (sum(self.in_flight) + 1) / self.n)

    def pick(self, prompt: Sequence[int]) -> int:
        if self.policy == "round_robin":
            r = self.next_rr
        elif self.policy == "least_loaded":
            r = self._least_loaded()
        else:
            r = self.ring.owner(prefix_key(prompt, self.block_size, self.prefix_blocks))
            if self.in_flight[r] + 1 > self.bound():
                r = self._least_loaded()
                self.spills += 1
        self.next_rr = (r + 1) % self.n
        self.in_flight[r] += 1
        return r

    def done(self, replica: int) -> None:
        self.in_flight[replica] -= 1
