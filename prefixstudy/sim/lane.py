"""Stage: sim.  The decode lane: steady decoders held outside vLLM's per-request loops.

A running request that is simply decoding (past its prompt, one token a step, nothing
speculative or structured) gets the same from vLLM every step: ``schedule()`` gives it one token
and calls ``KVCacheManager.allocate_slots``, which does something only when that token opens a
block (it allocates one) or fills one (it caches it), and ``update_from_output()`` appends one
sampled token.  The lane takes such requests out of ``scheduler.running`` ("held") and advances
them itself: their sampled tokens are appended lazily (when the KV cache manager needs their
block hashes, or when they go back), ``allocate_slots`` is called for them exactly at the steps
where it has an effect, and each step is priced with them in its batch.  vLLM's scheduler sees
the rest (prompts, requests about to finish) with its token budget and its admission limit
lowered by the number held, so it decides about them what it would decide with the held
requests in ``running``, because the lane holds requests only while:

- the held get their token before the budget could run out: all of ``running``'s demand fits in
  the budget, or every held request is ahead of every visible one in ``running`` (vLLM serves
  ``running`` in order);
- no allocation of a running request can fail, so nothing is preempted: the free blocks cover the
  held allocations and an upper bound of every visible running request's;
- the held allocations come before ``schedule()``, as in vLLM the running requests' come before
  the waiting ones', so a waiting request sees the free blocks and cached prefixes it would see
  (the order among running requests decides only which free block each gets: no record holds a
  block id, and the blocks evicted are the free queue's first ones either way);
- a held request goes back into ``running``, at its place, before the step at which it reaches
  ``max_tokens`` or ``max_model_len``: vLLM finishes it and frees its blocks in ``running``'s order.

A step that breaks a condition gets every held request back first, and vLLM schedules it as it
is.  While nothing is visible (nothing waits and every running request is held) the lane runs a
stretch of steps without ``schedule()`` at all, up to the next arrival, the point's deadline, the
next release or the step whose allocations would exceed the free blocks.

Under vLLM's async scheduling (an ``AsyncScheduler``, the default engine) step N+1 is scheduled
before step N's output is applied, so a decoding request is always in the step in flight, with one
output placeholder and one token in flight.  The lane takes it out of that step's
``SchedulerOutput`` (its token there is the lane's first), keeps its placeholder and in-flight
counts at one (each step adds one and applies one), and gives it back into the step in flight, at
its place in ``running``'s order, so that vLLM applies that token and finishes the request where it
would, and frees it in the order it would.  Its known tokens lag its computed ones by that token, so
``allocate_slots`` caches a filled block one step late: at the step that opens the next one.  A
stretch also skips ``update_from_output()``: the step in flight when it starts holds no request of
vLLM's, and the one in flight when it ends is an empty ``SchedulerOutput``, into which the held go
back.

Only schedulers without the features whose per-step state the lane does not replay take it
(``sim.lane_scope``); ``--stepwise`` turns it off.  ``tests/unit/sim/test_fast_path.py`` checks
that both give the same requests and steps, bit for bit.
"""

from __future__ import annotations

import heapq
import math

from prefixstudy.sim.lane_scope import lane_scope
from prefixstudy.costmodel.step import SAMPLED_TOKEN_ID, SimTrace, StepClock, StepFeatures, kv_tokens, launch_ms


class Held:
    """One held request: at the start of lane step g its computed tokens are ``base + g``; its
    sampled tokens are appended up to step ``appended``; its first token of the lane's is step
    ``since``'s (the step it was taken at; async, the step then in flight)."""

    __slots__ = ("req", "base", "since", "appended", "rank")

    def __init__(self, req, base: int, since: int, rank: int):
        self.req, self.base, self.since, self.appended, self.rank = req, base, since, since, rank


class DecodeLane:
    """The lane for one scheduler.  ``g`` counts the scheduler's steps; the driver calls
    ``before_schedule`` / ``after_step`` (async: ``step_priced`` / ``after_turn``) around each step
    it gives vLLM, and ``advance`` for a stretch without it."""

    def __init__(self, scheduler, manager, pipelined: bool = False, clock: StepClock | None = None):
        from vllm.v1.request import RequestStatus

        self.sched = scheduler
        self.kvm = scheduler.kv_cache_manager
        self.block_size = int(manager.block_size)
        self.req_to_blocks = manager.req_to_blocks  # request id -> its blocks (one group)
        self.caching = bool(self.kvm.enable_caching)  # without it, a call that allocates nothing does nothing
        self.running_status = RequestStatus.RUNNING
        self.token_budget = int(scheduler.max_num_scheduled_tokens)
        # vLLM 0.32 admits into running up to max_num_active_reqs, 0.26 up to max_num_running_reqs
        self.admit_attr = "max_num_active_reqs" if hasattr(scheduler, "max_num_active_reqs") \
            else "max_num_running_reqs"
        self.waiting_queues = [q for q in ("waiting", "kv_holding_waiting", "skipped_waiting")
                               if hasattr(scheduler, q)]
        # Async scheduling: a held request's token of the step in flight is the lane's, and goes back
        # with it (``in_flight``: that step, as the driver, ``clock``, holds it).
        self.pipelined, self.clock = pipelined, clock
        self.g = 0
        self.held: dict[str, Held] = {}
        self.by_phase: list[dict[str, Held]] = [{} for _ in range(self.block_size)]  # base % block size
        self.releases: list[tuple[int, int, str]] = []  # heap of (step it goes back before, rank, id)
        self.base_sum = 0
        self.max_rank = -1  # at least the highest rank held (not lowered on release: only ever safe)
        self.times: list[float] = []  # end of each step since times_g0, while anything is held
        self.times_g0 = 0
        self.rank: dict[str, int] = {}  # the visible running requests' places in running
        self.next_rank = 0
        self.steps = 0  # steps taken with at least one request held, over the scheduler's life
        self.stretch_steps = 0  # of those, steps taken without schedule()
        self.returns = 0  # steps whose conditions failed: every held request went back first
        self.lowered = 0

    @classmethod
    def for_scheduler(cls, scheduler, clock: StepClock | None = None) -> "DecodeLane | None":
        """The lane for the driver ``clock``, or None where the scheduler uses a feature with
        per-step state the lane does not replay, or decides by something the held requests would
        change."""
        scope = lane_scope(scheduler)
        return None if scope is None else cls(scheduler, *scope, clock=clock)

    @property
    def in_flight(self):
        """Async: the step scheduled whose output vLLM has not applied yet, or None."""
        return None if self.clock is None else self.clock.in_flight

    @property
    def num_held(self) -> int:
        return len(self.held)

    # -- taking and giving back ---------------------------------------------------------------

    def _limit(self, req, n: int) -> int:
        """Steps the request decodes without finishing, or -1 where it is not simply decoding."""
        s = self.sched
        # Async: its one token in flight is in the step in flight, and not yet among its tokens.
        lag, flying = (0, 1) if self.pipelined else (1, 0)
        if (req.status != self.running_status or n < req.num_prompt_tokens or req.num_tokens != n + lag
                or req.spec_token_ids or getattr(req, "num_output_placeholders", 0) != flying
                or getattr(req, "num_in_flight_tokens", flying) != flying
                or getattr(req, "num_stale_output_tokens", 0)
                or getattr(req, "next_decode_eligible_step", 0) > getattr(s, "current_step", 0) + flying
                or req.has_encoder_inputs or req.use_structured_output
                or len(self.req_to_blocks.get(req.request_id, ())) != -(-n // self.block_size)):
            return -1
        if flying:
            f = self.in_flight
            if f is None or f.so.num_scheduled_tokens.get(req.request_id) != 1 or req.request_id not in f.sampled:
                return -1
        # One step at a time, update_from_output's check_stop at step j sees num_tokens n + j + 2,
        # outputs o + j + 1.  Async, the step that schedule() would skip (its token in flight being
        # its last) is as many steps from its outputs; the model-length bound is then a step earlier
        # than it needs to be, and going back early is always exact.
        return min(req.max_tokens - req.num_output_tokens - 1, s.max_model_len - n - 2)

    def take(self) -> None:
        """After a step: rank the visible running requests (vLLM only appends to running) and hold
        the ones now simply decoding."""
        s = self.sched
        ranks, new_ranks, keep = self.rank, {}, []
        g, bs = self.g, self.block_size
        for req in s.running:
            rid = req.request_id
            r = ranks.get(rid)
            if r is None:  # appended since the last step (new, or resumed after a preemption)
                r = self.next_rank
                self.next_rank += 1
            n = req.num_computed_tokens
            limit = self._limit(req, n)
            if limit < 1:
                new_ranks[rid] = r
                keep.append(req)
                continue
            if self.pipelined:  # its token in the step in flight (g - 1) is now the lane's
                if not self.held:
                    self.times, self.times_g0 = [self.in_flight.end_s], g - 1
                h = Held(req, n - g, g - 1, r)
                h.appended = g
                del self.in_flight.so.num_scheduled_tokens[rid]
                self.in_flight.sampled.discard(rid)
            else:
                if not self.held:
                    self.times, self.times_g0 = [], g
                h = Held(req, n - g, g, r)
            self.held[rid] = h
            self.by_phase[h.base % bs][rid] = h
            self.base_sum += h.base
            self.max_rank = max(self.max_rank, r)
            heapq.heappush(self.releases, (g + limit, r, rid))
        if len(keep) != len(s.running):
            s.running[:] = keep
        self.rank = new_ranks

    def _catch_up(self, h: Held) -> None:
        """Bring a held request to the start of step g: its sampled tokens appended and its
        computed tokens set, as the steps it was held would have left them."""
        if h.appended < self.g:
            h.req.append_output_token_ids([SAMPLED_TOKEN_ID] * (self.g - h.appended))
            h.appended = self.g
        h.req.num_computed_tokens = h.base + self.g

    def _give_back(self, hs: list[Held], traces: dict[str, SimTrace]) -> None:
        """Put held requests back into running at their places, caught up, their token times
        recorded; async, each with its token in the step in flight."""
        flying = self.in_flight if self.pipelined else None
        last = self.g - (1 if self.pipelined else 0)  # the first step whose token is not the lane's
        for h in hs:
            self._catch_up(h)
            rid = h.req.request_id
            del self.held[rid]
            del self.by_phase[h.base % self.block_size][rid]
            self.base_sum -= h.base
            tr = traces.get(rid)
            if tr is not None:
                tr.token_times.extend(self.times[h.since - self.times_g0:last - self.times_g0])
            self.rank[rid] = h.rank
            if flying is not None:
                flying.so.num_scheduled_tokens[rid] = 1
                flying.sampled.add(rid)
        if flying is not None:  # vLLM applies (and finishes, and frees) in the order it scheduled: running's
            scheduled = flying.so.num_scheduled_tokens
            ordered = sorted(scheduled.items(), key=lambda kv: self.rank.get(kv[0], -1))
            scheduled.clear()
            scheduled.update(ordered)
        if not self.held:
            self.releases, self.max_rank, self.times, self.times_g0 = [], -1, [], self.g
        merged = sorted([h.req for h in hs] + self.sched.running, key=lambda r: self.rank[r.request_id])
        self.sched.running[:] = merged

    def give_back_all(self, traces: dict[str, SimTrace]) -> None:
        if self.held:
            self._give_back(list(self.held.values()), traces)

    def give_back_due(self, traces: dict[str, SimTrace]) -> None:
        """Give back the held requests that finish at this step."""
        due = []
        while self.releases and self.releases[0][0] <= self.g:
            due.append(self.held[heapq.heappop(self.releases)[2]])
        if due:
            self._give_back(due, traces)

    # -- one step through vLLM's scheduler ----------------------------------------------------

    def _block_events(self, g: int) -> tuple[int, list[Held]]:
        """Step g's held allocations: how many blocks it takes, and the requests whose state the
        KV cache manager must see (a token opening a block allocates it; with prefix caching on,
        one filling a block caches it, async at the step that opens the next), in running's
        order."""
        bs = self.block_size
        opening = self.by_phase[-g % bs]
        filling = self.by_phase[(-g - 1) % bs] if self.caching and not self.pipelined else None
        if not filling:
            return len(opening), sorted(opening.values(), key=lambda h: h.rank)
        return len(opening), sorted([*opening.values(), *filling.values()], key=lambda h: h.rank)

    def _allocate(self, events: list[Held]) -> None:
        """What ``schedule()``'s ``allocate_slots(request, 1)`` does for each, and all it does for a
        decoding request of a full-attention model whose allocation cannot fail: a block opened is
        allocated (every full block before it is already cached), a block filled is cached."""
        coordinator, kvm, bs, g = self.kvm.coordinator, self.kvm, self.block_size, self.g
        cache_late = self.pipelined and self.caching
        for h in events:
            self._catch_up(h)
            n = h.base + g + 1  # the request's tokens with a slot once this step's token has one
            if n % bs == 1:
                coordinator.allocate_new_blocks(h.req.request_id, n, n)
                if cache_late:  # async: its known tokens end with the block before (min(n, num_tokens))
                    kvm.cache_blocks(h.req, n - 1)
            else:
                kvm.cache_blocks(h.req, n)

    def _visible_fits(self, n_alloc: int) -> bool:
        """Whether this step's conditions hold with the held kept out of running."""
        s, bs, budget = self.sched, self.block_size, self.token_budget
        need, demand, first_rank = n_alloc, 0, None
        for req in s.running:
            want = req.num_tokens_with_spec + getattr(req, "num_output_placeholders", 0) - req.num_computed_tokens
            demand += want
            after = req.num_computed_tokens + min(want, budget)
            need += max(0, -(-after // bs) - len(self.req_to_blocks.get(req.request_id, ())))
            if first_rank is None:
                first_rank = self.rank.get(req.request_id, self.next_rank)
        held = len(self.held)
        if need > self.kvm.block_pool.get_num_free_blocks():
            return False
        return held + demand <= budget or (held <= budget and (first_rank is None or first_rank > self.max_rank))

    def before_schedule(self, traces: dict[str, SimTrace]) -> None:
        """Give back what finishes now; if the step's conditions fail, everything; else make the
        held allocations and lower vLLM's limits by the number held (``after_schedule`` restores
        them)."""
        self.give_back_due(traces)
        if not self.held:
            return
        n_alloc, events = self._block_events(self.g)
        if not self._visible_fits(n_alloc):
            self.returns += 1
            self.give_back_all(traces)
            return
        self._allocate(events)
        self.lowered = len(self.held)
        self.sched.max_num_scheduled_tokens -= self.lowered
        setattr(self.sched, self.admit_attr, getattr(self.sched, self.admit_attr) - self.lowered)

    def after_schedule(self) -> None:
        if self.lowered:
            self.sched.max_num_scheduled_tokens += self.lowered
            setattr(self.sched, self.admit_attr, getattr(self.sched, self.admit_attr) + self.lowered)
            self.lowered = 0

    def held_features(self, f: StepFeatures) -> StepFeatures:
        """The step's features with the held requests' tokens added (one decode token each)."""
        n = len(self.held)
        if not n:
            return f
        return StepFeatures(f.prefill_tokens, f.decode_tokens + n, f.context_tokens + self.base_sum + n * (self.g + 1),
                            f.num_reqs + n, f.cached_tokens, f.num_prefill_reqs, f.prompt_tokens_new, f.kv_tokens,
                            f.prefix_queries)

    def after_step(self, end_s: float) -> None:
        self.step_priced(end_s)
        self.after_turn()

    def step_priced(self, end_s: float) -> None:
        """The step just scheduled ends at ``end_s`` (its held tokens reach the client then)."""
        if self.held:
            self.times.append(end_s)
            self.steps += 1

    def after_turn(self) -> None:
        """After a step was handed over (async: and the one before it applied)."""
        self.g += 1
        self.take()

    # -- a stretch without vLLM's scheduler ---------------------------------------------------

    def advance(self, sim: StepClock, record: bool, stop_s: float) -> int:
        """Where every running request is held and nothing waits, run the stretch that starts now
        (no step starts at or after ``stop_s`` but the first); returns its number of steps, 0
        where none can be taken here."""
        s = self.sched
        n = len(self.held)
        if not n or s.running or any(len(getattr(s, q)) for q in self.waiting_queues) \
                or n > self.token_budget:
            return 0
        flying = sim.in_flight if self.pipelined else None
        if self.pipelined and (flying is None or flying.so.num_scheduled_tokens or flying.sampled
                               or not hasattr(type(flying.so), "make_empty")):
            return 0
        free = self.kvm.block_pool.get_num_free_blocks()
        last = self.releases[0][0] if self.releases else math.inf  # the first step not taken here
        new_step = getattr(self.kvm, "new_step_starts", None)
        counts_steps = hasattr(s, "current_step")
        used = j = 0
        flying_end = flying.end_s if flying is not None else math.nan
        while self.g < last:
            start_s = sim.clock_s
            if j and not start_s < stop_s:
                break
            n_alloc, events = self._block_events(self.g)
            if used + n_alloc > free:
                break
            used += n_alloc
            if counts_steps:
                s.current_step += 1
            if new_step is not None:
                new_step()
            self._allocate(events)
            feats = StepFeatures(0, n, self.base_sum + n * (self.g + 1), n, kv_tokens=kv_tokens(self.sched))
            step_ms = float(sim.cost_ms(feats))
            if flying is not None:  # async: scheduled now, it runs once the step in flight ends and it is launched
                start_s = max(flying_end, start_s + launch_ms(sim.cost_ms, feats) / 1e3)
                flying_end = start_s + step_ms / 1e3
                sim.clock_s = start_s
            else:
                sim.clock_s = start_s + step_ms / 1e3
            sim.num_steps += 1
            if record:
                sim.steps.append(sim.step_row(start_s, step_ms, feats))
            self.times.append(flying_end if flying is not None else sim.clock_s)
            self.steps += 1
            self.stretch_steps += 1
            self.g += 1
            j += 1
        if j:
            self._after_steps()
            if flying is not None:
                sim.in_flight = type(flying)(type(flying.so).make_empty(), set(), flying_end)
        return j

    def _after_steps(self) -> None:
        """What the skipped schedule() calls leave on the scheduler itself after such steps."""
        s = self.sched
        s.finished_req_ids = set()
        if hasattr(s, "reset_preempted_req_ids"):
            s.reset_preempted_req_ids = set()
        prev = getattr(s, "prev_step_scheduled_req_ids", None)
        if prev is not None and not getattr(s, "use_v2_model_runner", False):
            prev.clear()
        if hasattr(s, "prefill_capacity_bound"):
            s.prefill_capacity_bound = False  # nothing waits: num_waiting > len(deferred) is False
