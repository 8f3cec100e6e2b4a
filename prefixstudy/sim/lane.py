"""Stage: sim.  The decode lane: many engine steps at once where vLLM's decisions repeat.

While nothing waits, every running request is past its prompt and none can finish, preempt or
be joined by an arrival, ``schedule()`` gives each running request one token a step, in
``running`` order, and ``update_from_output()`` appends one sampled token to each.  The lane
replays such a stretch without either call and leaves vLLM's state as the step-by-step path
would: each request's ``num_computed_tokens`` and output tokens (so its block hashes), and the
KV cache itself, because ``KVCacheManager.allocate_slots`` is called exactly where and in the
order ``schedule()`` calls it with effect (a request's first token in a new block allocates that
block; its last token in a block caches the full block).  Every other call ``schedule()`` makes
in such a step does nothing for a full-attention model, so it is skipped.

The stretch ends before: the first step that starts at or after the next arrival or past the
point's deadline (the caller passes the earlier of the two), the step at which any request would
reach ``max_tokens`` or ``max_model_len`` (it finishes and frees blocks: left to vLLM), and the
step whose block allocations would exceed the free blocks at the start (no block is freed inside
the lane, so up to there no allocation can fail and nothing is preempted).  Each step is priced
and recorded as ``Simulator.step`` prices and records it, from the same ``StepFeatures``.

Only schedulers without the features whose per-step state the lane does not replay take it
(``for_scheduler``: speculative decoding, KV or encoder connectors, LoRA, async scheduling,
deferred block frees, more than one KV-cache group or another attention kind); ``--stepwise``
turns it off.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from prefixstudy.sim.step import SAMPLED_TOKEN_ID, StepFeatures

if TYPE_CHECKING:
    from prefixstudy.sim.driver import Simulator, SimTrace


class DecodeLane:
    """The lane for one scheduler; ``advance`` runs one stretch."""

    def __init__(self, scheduler, manager):
        from vllm.v1.request import RequestStatus

        self.sched = scheduler
        self.kvm = scheduler.kv_cache_manager
        self.block_size = int(manager.block_size)
        self.req_to_blocks = manager.req_to_blocks  # request id -> its blocks (one group)
        self.running_status = RequestStatus.RUNNING
        self.lookahead = int(getattr(scheduler, "num_lookahead_tokens", 0))
        self.steps = 0  # steps taken in the lane, over the scheduler's life
        self.token_budget = int(getattr(scheduler, "max_num_scheduled_tokens",
                                        scheduler.scheduler_config.max_num_batched_tokens))

    @classmethod
    def for_scheduler(cls, scheduler) -> "DecodeLane | None":
        """The lane, or None where the scheduler uses a feature with per-step state the lane
        does not replay."""
        vc = scheduler.vllm_config
        coordinator = getattr(scheduler.kv_cache_manager, "coordinator", None)
        managers = getattr(coordinator, "single_type_managers", ())
        if (vc.speculative_config is not None or getattr(vc, "lora_config", None) is not None
                or getattr(vc.scheduler_config, "async_scheduling", False)
                or any(getattr(scheduler, a, None) is not None
                       for a in ("connector", "ec_connector", "aux_output_connector"))
                or getattr(scheduler, "defer_block_free", False)
                or getattr(scheduler, "num_lookahead_tokens", 0)
                or len(managers) != 1 or type(managers[0]).__name__ != "FullAttentionManager"):
            return None
        return cls(scheduler, managers[0])

    def _steady(self, running) -> tuple[list[int], int] | None:
        """(computed tokens of each running request, most steps none of them finishes in), or
        None where some request is not simply decoding."""
        bs, limit, computed = self.block_size, math.inf, []
        s = self.sched
        step = getattr(s, "current_step", 0)
        for req in running:
            n = req.num_computed_tokens
            if (req.status != self.running_status or n < req.num_prompt_tokens or req.num_tokens != n + 1
                    or req.spec_token_ids or getattr(req, "num_output_placeholders", 0)
                    or getattr(req, "next_decode_eligible_step", 0) > step or req.has_encoder_inputs
                    or req.use_structured_output
                    or len(self.req_to_blocks.get(req.request_id, ())) != -(-n // bs)):
                return None
            # update_from_output's check_stop at step j sees num_tokens n + j + 2, outputs o + j + 1.
            limit = min(limit, req.max_tokens - req.num_output_tokens - 1, s.max_model_len - n - 2)
            computed.append(n)
        return computed, limit

    def advance(self, sim: "Simulator", traces: dict[str, "SimTrace"], record: bool, stop_s: float) -> int:
        """Run the stretch that starts now (no step starts at or after ``stop_s`` but the first);
        returns its number of steps, 0 where none can be taken here."""
        s = self.sched
        if len(s.waiting) or len(getattr(s, "kv_holding_waiting", ())):
            return 0
        running = list(s.running)
        n_reqs = len(running)
        if not n_reqs or n_reqs > self.token_budget or n_reqs > s.max_num_running_reqs:
            return 0
        steady = self._steady(running)
        if steady is None or steady[1] < 1:
            return 0
        computed, limit = steady
        bs = self.block_size
        allocs, events = self._block_events(computed)
        free = self.kvm.block_pool.get_num_free_blocks()
        new_step = getattr(self.kvm, "new_step_starts", None)
        counts_steps = hasattr(s, "current_step")
        appended = [0] * n_reqs
        context0 = sum(computed)
        times: list[float] = []
        used = j = 0
        while j < limit:
            start_s = sim.clock_s
            if j and not start_s < stop_s:
                break
            q = j % bs
            if used + allocs[q] > free:
                break
            used += allocs[q]
            if counts_steps:
                s.current_step += 1
            if new_step is not None:
                new_step()
            for idx in events[q]:
                req = running[idx]
                self._catch_up(req, idx, appended, computed, j)
                if self.kvm.allocate_slots(req, 1, num_lookahead_tokens=self.lookahead) is None:
                    raise RuntimeError(f"decode lane: allocation failed for {req.request_id} with {free - used} "
                                       f"blocks counted free")
            feats = StepFeatures(0, n_reqs, context0 + n_reqs * (j + 1), n_reqs)
            step_ms = float(sim.cost_ms(feats))
            sim.clock_s = start_s + step_ms / 1e3
            sim.num_steps += 1
            times.append(sim.clock_s)
            if record:
                sim.steps.append(sim.step_row(start_s, step_ms, feats))
            j += 1
        if not j:
            return 0
        for idx, req in enumerate(running):
            self._catch_up(req, idx, appended, computed, j)
            tr = traces.get(req.request_id)
            if tr is not None:
                tr.token_times.extend(times)
        self._after_steps({r.request_id for r in running})
        self.steps += j
        return j

    def _block_events(self, computed: list[int]) -> tuple[list[int], list[list[int]]]:
        """Per step phase q (step j mod block size): how many blocks that step allocates, and the
        requests whose state the KV cache manager must see then.  Step j allocates for requests
        whose n + j is a block boundary and caches for those whose n + j + 1 is; both depend on j
        only through j mod block size."""
        bs = self.block_size
        by_phase: list[list[int]] = [[] for _ in range(bs)]
        for idx, n in enumerate(computed):
            by_phase[n % bs].append(idx)
        allocs = [len(by_phase[-q % bs]) for q in range(bs)]
        events = [sorted(set(by_phase[-q % bs] + by_phase[(-q - 1) % bs])) for q in range(bs)]
        return allocs, events

    @staticmethod
    def _catch_up(req, idx: int, appended: list[int], computed: list[int], j: int) -> None:
        """Bring one request to where ``j`` lane steps leave it: its sampled tokens appended (lazily,
        only when the KV cache manager or the end of the stretch needs them) and its computed tokens."""
        if appended[idx] < j:
            req.append_output_token_ids([SAMPLED_TOKEN_ID] * (j - appended[idx]))
            appended[idx] = j
        req.num_computed_tokens = computed[idx] + j

    def _after_steps(self, scheduled_ids: set[str]) -> None:
        """What the skipped schedule() calls leave on the scheduler itself after such steps."""
        s = self.sched
        s.finished_req_ids = set()
        if hasattr(s, "reset_preempted_req_ids"):
            s.reset_preempted_req_ids = set()
        prev = getattr(s, "prev_step_scheduled_req_ids", None)
        if prev is not None and not getattr(s, "use_v2_model_runner", False):
            prev.clear()
            prev.update(scheduled_ids)
        if hasattr(s, "prefill_capacity_bound"):
            s.prefill_capacity_bound = False  # nothing waits: num_waiting > len(deferred) is False
