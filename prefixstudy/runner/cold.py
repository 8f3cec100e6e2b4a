"""Cold starts that are proven: before each point the runner isolates the prefix cache, by a reset
(``sweep.cache_isolation: reset``) or by a cache salt of the point's own (``salt``: vLLM's
per-request ``cache_salt``, for servers with no reset endpoint), and a probe checks that it took.

The probe is a prompt of fresh tokens (whole blocks no dataset row starts with, plus one token),
sent for one output token:

* twice before the isolation (under the previous salt): the second send must hit, which shows the
  engine caches the probe and reports its hits (else the probe cannot see a warm cache: the point
  runs, ``cold_probe`` says ``unverified``, and a warning says so once per engine);
* once after it: it must hit 0 tokens.  A probe that still hits is a reset (or salt) that did not
  take: the point fails with the numbers, and ``--resume`` runs it again.

A probe request that fails (a server answering errors) checks nothing: the point runs, its
``cold_probe`` says ``probe failed`` with the error, and its own requests show what fails.

The probe is no measured request: it is sent before the primes and warm-ups, outside every timing,
counter scrape and step record of the point.  ``verdict`` is the check itself, pure."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable

import numpy as np

from prefixstudy.engines import RequestTrace
from prefixstudy.runner.plan import token_range
from prefixstudy.workloads.base import DatasetRow

log = logging.getLogger(__name__)

PROBE_BLOCKS = 2  # whole blocks of the probe prompt (one, where two do not fit max_model_len)
PROBE_SEED = 20_011

# cold_probe, per point: what the probe found.
COLD, UNVERIFIED, NOT_RESET, CACHING_OFF, WARM = "cold", "unverified", "not reset", "caching off", "warm"
PROBE_FAILED = "probe failed"


class ColdStartFailed(Exception):
    """The point cannot run: its cache was not cold.  ``meta``: the probe's keys for the point's
    manifest entry."""

    def __init__(self, why: str, meta: dict):
        super().__init__(why)
        self.meta = meta


class ProbeFailed(Exception):
    """A probe request failed (an error, a timeout): the cache is not checked, the point runs."""


def probe_prompt(rng: np.random.Generator, block_size: int, max_model_len: int, lo: int, hi: int,
                 avoid: set[tuple[int, ...]]) -> list[int]:
    """Whole blocks of fresh ids in [lo, hi) and one token more (vLLM never serves a prompt's last
    token from its cache), whose first block is none of ``avoid`` (the dataset rows' first blocks):
    no row can share a cached block with it."""
    blocks = PROBE_BLOCKS if PROBE_BLOCKS * block_size + 2 <= max_model_len else 1
    while True:
        prompt = rng.integers(lo, hi, size=blocks * block_size + 1).tolist()
        if tuple(prompt[:block_size]) not in avoid:
            return prompt


def verdict(isolation: str, prompt_tokens: int, warm: list[int | None], cold: list[int | None]) -> tuple[str, str]:
    """(cold_probe, error) from the probe's cached tokens, one per cache (a fleet: per replica):
    ``warm`` of the send before the isolation that must hit, ``cold`` of the send after it that
    must not.  None: the engine did not report the count.  error "": the point may run."""
    if any(c is not None and c > 0 for c in cold):
        hot = max(c for c in cold if c is not None)
        seen = min((w for w in warm if w is not None), default=0)
        what = ("the prefix-cache reset did not take" if isolation == "reset"
                else "the point's cache salt did not isolate it")
        before = "before the reset" if isolation == "reset" else "under the previous salt"
        return WARM, (f"cold-start probe: {what}: a fresh {prompt_tokens}-token probe hit {seen} cached tokens "
                      f"{before} and {hot} after it (0 expected)")
    if any(w is None or w == 0 for w in warm):
        return UNVERIFIED, ""
    return COLD, ""


class ColdStart:
    """One engine's isolation and probe, point after point (``runner.session.ModeSession``)."""

    def __init__(self, isolation: str, mode: str, rows: list[DatasetRow], caching: bool, max_model_len: int):
        self.isolation, self.mode, self.caching = isolation, mode, caching
        self.rows, self.max_model_len = rows, max_model_len
        self.lo, self.hi = token_range(rows)
        self.rng = np.random.default_rng(PROBE_SEED)
        # Unique to this engine's run: a server kept from an earlier run holds none of its salts.
        self.run_token = uuid.uuid4().hex[:12]
        self.warned = False
        self._avoid: dict[int, set[tuple[int, ...]]] = {}

    def _first_blocks(self, block_size: int) -> set[tuple[int, ...]]:
        if block_size not in self._avoid:
            self._avoid[block_size] = {tuple(r.prompt_token_ids[:block_size]) for r in self.rows}
        return self._avoid[block_size]

    async def isolate(self, engine, send: Callable[[list[int], str], Awaitable[list[RequestTrace]]],
                      rid: Callable[[str], str]) -> tuple[dict, list[int], list[RequestTrace]]:
        """Isolate the point's cache and probe it.  Returns the point's probe keys, the probe's
        prompt and the traces of its send after the isolation (it stays in the cache: the runner's
        cache estimate replays it).  Raises ColdStartFailed."""
        meta: dict = {"cache_isolation": self.isolation}
        new_salt = f"prefixstudy-{self.run_token}-{rid('salt')}"  # names the arm, rate and repeat
        if self.isolation == "salt":
            meta["cache_salt"] = new_salt
        if not self.caching:  # nothing to empty or to probe: an arm without a cache starts cold
            await self._isolate(engine, new_salt)
            return {**meta, "cold_probe": CACHING_OFF}, [], []
        prompt = probe_prompt(self.rng, engine.block_size or 16, self.max_model_len, self.lo, self.hi,
                              self._first_blocks(engine.block_size or 16))
        meta["probe_prompt_tokens"] = len(prompt)
        try:
            await self._send(send, prompt, rid("probe"))
            warm = [_count(t) for t in await self._send(send, prompt, rid("probe"))]
        except ProbeFailed as e:  # the point still gets its isolation, and runs: its requests tell what fails
            await self._isolate(engine, new_salt)
            return {**meta, "cold_probe": PROBE_FAILED, "probe_error": str(e)}, [], []
        took = await self._isolate(engine, new_salt)
        try:
            after = await self._send(send, prompt, rid("probe"))
        except ProbeFailed as e:
            return {**meta, "cold_probe": PROBE_FAILED, "probe_error": str(e)}, [], []
        cold = [_count(t) for t in after]
        meta["probe_warm_cached_tokens"] = min((w for w in warm if w is not None), default=None)
        meta["probe_cold_cached_tokens"] = max((c for c in cold if c is not None), default=None)
        if took is False:  # the engine has no reset (a server without its endpoint): it warned at the reset
            return {**meta, "cold_probe": NOT_RESET}, prompt, after
        status, why = verdict(self.isolation, len(prompt), warm, cold)
        meta["cold_probe"] = status
        if why:
            raise ColdStartFailed(why, meta)
        if status == UNVERIFIED and not self.warned:
            self.warned = True
            # One line; what the probe's second send saw is the manifest's probe_warm_cached_tokens.
            log.warning("warning: cache %s: the cold-start probe sees no cache hits here, so its %s is not verified "
                        "(manifest: cold_probe)", self.mode.upper(), "reset" if self.isolation == "reset" else "cache salt")
        return meta, prompt, after

    async def _isolate(self, engine, new_salt: str) -> bool | None:
        """The reset, or the point's salt.  False: the engine has no reset (it said so)."""
        if self.isolation == "salt":
            engine.set_cache_salt(new_salt)
            return True
        if getattr(engine, "cache_salt", ""):  # a kept engine (engines.pool) salted by an earlier study
            engine.set_cache_salt("")
        return await engine.reset_prefix_cache()

    @staticmethod
    async def _send(send, prompt: list[int], request_id: str) -> list[RequestTrace]:
        try:
            traces = await send(prompt, request_id)
        except Exception as e:  # noqa: BLE001 - any failure of the probe is recorded in one line
            raise ProbeFailed(f"{type(e).__name__}: {e}"[:500]) from e
        bad = next((t.error for t in traces if t.error), "")
        if bad:
            raise ProbeFailed(bad[:500])
        return traces


def _count(trace: RequestTrace) -> int | None:
    return trace.num_cached_tokens if trace.cached_tokens_reported else None
