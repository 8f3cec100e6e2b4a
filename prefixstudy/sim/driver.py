"""Stage: sim.  Drives vLLM's real scheduler in virtual time: the engine loop without a model.

Each step: ``schedule()``, price the step with a step-cost model, advance the virtual clock by it,
fabricate the ``ModelRunnerOutput`` (one sampled token per request that is decoding or has just
finished its prompt), ``update_from_output()``.  A request is added when the clock passes its
arrival.  What the schedule looks like (batching, chunked prefill, prefix hits, preemption, LRU
eviction) is vLLM's own decision; only the cost of a step is ours.

With vLLM's async scheduling (an ``AsyncScheduler``: the default engine) the loop is vLLM's
two-deep batch queue instead: step N+1 is scheduled and launched on the host while step N runs on
the GPU, and step N's output is applied after that.  In virtual time, step N+1 is scheduled at the
moment step N starts (so a request that arrives while N runs waits for N+2), runs from N's end for
its price, and its tokens reach the client when it ends; step N's output reaches the scheduler only
after N+1 is scheduled, one step later than without.  Where the cost model's host part is the host's
work to launch a step (``CostModel.launch_ms``), N+1 starts only once it is launched too: the GPU
waits where the host takes longer than N; otherwise the price is max(GPU part, host part).

Hands on, per request, a ``SimTrace`` (virtual stamps) and, per step, one row in the
iteration layout (``step_start_s``, ``t_s``, ``step_ms``, ``prefill_tokens``, ...).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

from prefixstudy.sim.lane import DecodeLane
from prefixstudy.costmodel.step import SAMPLED_TOKEN_ID, SimTrace, StepCost, StepFeatures, kv_tokens, launch_ms
from prefixstudy.sim.vllm_setup import make_request, runner_output


@dataclass(frozen=True)
class InFlight:
    """A scheduled step whose output the scheduler has not seen yet (async scheduling)."""

    so: object  # vLLM's SchedulerOutput
    sampled: set[str]
    end_s: float  # when it ends on the GPU: its tokens reach the client then


@dataclass(frozen=True)
class SimRequest:
    request_id: str
    prompt_token_ids: list[int]
    output_len: int
    arrival_s: float  # virtual seconds; ignored for a request with a parent
    # A later turn of a session (the runner's one rule of dependence): it arrives think_s after its
    # parent finished, with the parent's prompt + the parent's generated ids + prompt_token_ids.
    parent: str | None = None
    think_s: float = 0.0


class Simulator:
    """One engine (one mode): a scheduler, its block hasher, a cost model, and a virtual clock
    that only ever moves forward (idle gaps jump to the next arrival)."""

    def __init__(self, scheduler, hasher, cost_ms: StepCost, stepwise: bool = False):
        self.sched, self.hasher, self.cost_ms = scheduler, hasher, cost_ms
        self.clock_s = 0.0
        self.steps: list[dict] = []
        self.num_steps = 0
        # The decode lane (``sim.lane``) keeps steadily decoding requests out of vLLM's per-request
        # loops; ``stepwise`` keeps every step on vLLM's own scheduler, to check it against.
        self.lane = None if stepwise else DecodeLane.for_scheduler(scheduler, self)
        # vLLM's async scheduling, as the scheduler was built
        self.pipelined = bool(getattr(scheduler.scheduler_config, "async_scheduling", False))
        self.in_flight: InFlight | None = None

    def reset_prefix_cache(self) -> bool:
        return bool(self.sched.reset_prefix_cache())

    def run(self, requests: list[SimRequest], record: bool = True,
            deadline_s: float = math.inf) -> dict[str, SimTrace]:
        """Run ``requests`` (arrival times on this simulator's clock) until all finish or the
        clock passes ``deadline_s``; what is open then is aborted.  Steps are appended to
        ``self.steps`` when ``record``."""
        pending = sorted((r for r in requests if r.parent is None), key=lambda r: r.arrival_s)
        children: dict[str, list[SimRequest]] = {}
        for r in requests:
            if r.parent is not None:
                children.setdefault(r.parent, []).append(r)
        traces = {r.request_id: SimTrace(r.arrival_s if r.parent is None else math.inf) for r in requests}
        sent: dict[str, list[int]] = {}  # the prompt each request was sent with
        i = 0
        lane = self.lane
        while i < len(pending) or self.unfinished():
            while i < len(pending) and pending[i].arrival_s <= self.clock_s:
                r = pending[i]
                sent[r.request_id] = r.prompt_token_ids
                self.sched.add_request(make_request(r.request_id, r.prompt_token_ids, r.output_len,
                                                    r.arrival_s, self.hasher))
                i += 1
            if self.clock_s > deadline_s:
                self.in_flight = None  # its tokens are past the deadline: the runner has cancelled
                if lane is not None:
                    lane.give_back_all(traces)
                self._abort([r.request_id for r in pending[:i]])
                for tr in traces.values():  # the real runner cancels at the deadline: later tokens never arrive
                    tr.token_times = [t for t in tr.token_times if t <= deadline_s]
                break
            if not self.unfinished():
                self.clock_s = max(self.clock_s, pending[i].arrival_s)  # idle: jump to the next arrival
                continue
            if lane is not None:
                lane.give_back_due(traces)
                next_arrival_s = pending[i].arrival_s if i < len(pending) else math.inf
                if lane.advance(self, record, min(next_arrival_s, math.nextafter(deadline_s, math.inf))):
                    continue  # back to the arrivals and the deadline, as after any step
            for rid in self.step(traces, record):
                for c in children.pop(rid, ()):  # release the finished parent's next turns
                    done = traces[rid]
                    prompt = sent[rid] + [SAMPLED_TOKEN_ID] * len(done.token_times) + c.prompt_token_ids
                    arrival = done.token_times[-1] + c.think_s
                    traces[c.request_id].arrival_s = arrival
                    bisect.insort(pending, SimRequest(c.request_id, prompt, c.output_len, arrival), i,
                                  key=lambda r: r.arrival_s)
        for rid, prompt in sent.items():
            traces[rid].prompt_token_ids = prompt
        return traces

    def unfinished(self) -> bool:
        """Requests running or waiting, the lane's held ones included."""
        return self.sched.has_unfinished_requests() or bool(self.lane is not None and self.lane.held)

    def _abort(self, request_ids: list[str]) -> None:
        from vllm.v1.request import RequestStatus

        open_ids = [r for r in request_ids if r in self.sched.requests]
        if open_ids:
            self.sched.finish_requests(open_ids, RequestStatus.FINISHED_ABORTED)

    def step(self, traces: dict[str, SimTrace], record: bool) -> list[str]:
        """One engine step; returns the requests it finished."""
        if self.pipelined:
            return self.step_pipelined(traces, record)
        start_s = self.clock_s
        lane = self.lane
        so = self._schedule(traces)
        feats, sampled_ids, new_ids = self.features(so)
        if lane is not None:
            feats = lane.held_features(feats)
        step_ms = float(self.cost_ms(feats)) if feats.prefill_tokens + feats.decode_tokens else 0.0
        self.clock_s = start_s + step_ms / 1e3
        done = self._apply(InFlight(so, sampled_ids, self.clock_s), traces)
        self.num_steps += 1
        self._stamp_scheduled(new_ids, traces, start_s)
        if record:
            self.steps.append(self.step_row(start_s, step_ms, feats))
        if lane is not None:
            lane.after_step(self.clock_s)
        return done

    def step_pipelined(self, traces: dict[str, SimTrace], record: bool) -> list[str]:
        """vLLM's async engine loop, one turn: schedule the next step now (the host's clock: the
        in-flight step has just started on the GPU), price it, queue it behind the in-flight one,
        then wait for the in-flight step to end and apply its output.  With nothing in flight (the
        first step after an idle spell) the next turn schedules again at once, as vLLM does with
        its queue not yet full.  Returns the requests the applied step finished."""
        lane = self.lane
        so = self._schedule(traces)
        feats, sampled_ids, new_ids = self.features(so)
        if lane is not None:
            feats = lane.held_features(feats)
        busy = feats.prefill_tokens + feats.decode_tokens
        step_ms = float(self.cost_ms(feats)) if busy else 0.0
        launched_s = self.clock_s + (launch_ms(self.cost_ms, feats) / 1e3 if busy else 0.0)
        prev = self.in_flight
        start_s = max(prev.end_s if prev is not None else self.clock_s, launched_s)
        self._stamp_scheduled(new_ids, traces, self.clock_s)
        self.num_steps += 1
        if record and busy:
            self.steps.append(self.step_row(start_s, step_ms, feats))
        new = InFlight(so, sampled_ids, start_s + step_ms / 1e3)
        if lane is not None:
            lane.step_priced(new.end_s)
        done: list[str] = []
        if prev is not None:  # the host turns to the next step once this one is launched and the last is out
            self.clock_s = max(prev.end_s, launched_s)
            done = self._apply(prev, traces)
        else:  # the queue not yet full: the next step is scheduled as soon as this one is launched
            self.clock_s = launched_s
        if busy:
            self.in_flight = new
        else:  # nothing to run: its (empty) output is there at once
            self.in_flight = None
            done += self._apply(new, traces)
        if lane is not None:
            lane.after_turn()
        return done

    def _schedule(self, traces: dict[str, SimTrace]):
        """vLLM's ``schedule()``, with the lane's held requests out of ``running`` and their
        allocations made first."""
        lane = self.lane
        if lane is None:
            return self.sched.schedule()
        lane.before_schedule(traces)
        try:
            return self.sched.schedule()
        finally:
            lane.after_schedule()

    @staticmethod
    def _stamp_scheduled(new_ids: dict[str, int], traces: dict[str, SimTrace], at_s: float) -> None:
        for rid, cached in new_ids.items():
            tr = traces.get(rid)
            if tr is not None and math.isnan(tr.scheduled_s):
                tr.scheduled_s, tr.num_cached_tokens = at_s, cached

    def _apply(self, step: InFlight, traces: dict[str, SimTrace]) -> list[str]:
        """Hand the scheduler a step's output; its tokens reach the client as the step ends."""
        req_ids = list(step.so.num_scheduled_tokens)
        sampled = [[SAMPLED_TOKEN_ID] if r in step.sampled else [] for r in req_ids]
        self.sched.update_from_output(step.so, runner_output(req_ids, sampled))
        for rid in step.sampled:
            if rid in traces:
                traces[rid].token_times.append(step.end_s)
        return [r for r in req_ids if r not in self.sched.requests]

    def features(self, so) -> tuple[StepFeatures, set[str], dict[str, int]]:
        """The step's cost inputs, the requests that sample a token, and the requests scheduled for
        the first time with their cached prompt tokens.  ``schedule()`` has already advanced each
        request's ``num_computed_tokens`` by what it scheduled."""
        prefill = decode = context = n_prefill = 0
        sampled: set[str] = set()
        for rid, n in so.num_scheduled_tokens.items():
            req = self.sched.requests[rid]
            after = req.num_computed_tokens
            p = max(0, min(after, req.num_prompt_tokens) - (after - n))
            prefill, decode, context = prefill + p, decode + n - p, context + after
            n_prefill += p > 0
            if after >= req.num_tokens:  # every known token computed: the model samples the next
                sampled.add(rid)
        new_ids = {nr.req_id: nr.num_computed_tokens for nr in so.scheduled_new_reqs}
        new_prompt = sum(len(nr.prompt_token_ids or ()) for nr in so.scheduled_new_reqs)
        feats = StepFeatures(prefill, decode, context, len(so.num_scheduled_tokens), sum(new_ids.values()),
                             n_prefill, new_prompt, kv_tokens(self.sched), new_prompt if self.hasher is not None else 0)
        return feats, sampled, new_ids

    def step_row(self, start_s: float, step_ms: float, f: StepFeatures) -> dict:
        caching = self.hasher is not None  # vLLM counts no prefix-cache queries with caching off
        usage = getattr(self.sched.kv_cache_manager, "usage", math.nan)
        return {"step_start_s": start_s, "t_s": start_s + step_ms / 1e3, "step_ms": step_ms,
                "prefill_tokens": f.prefill_tokens, "cached_tokens": f.cached_tokens,
                "decode_tokens": f.decode_tokens, "context_tokens": f.context_tokens,
                "num_prefill_reqs": f.num_prefill_reqs, "num_decode_reqs": f.num_reqs - f.num_prefill_reqs,
                "num_running": len(self.sched.running) + (self.lane.num_held if self.lane else 0),
                "num_waiting": len(self.sched.waiting),
                "kv_cache_usage": float(usage), "prefix_queries": f.prefix_queries,
                "prefix_hits": f.cached_tokens if caching else 0,
                "prompt_tokens": f.prefill_tokens, "generation_tokens": f.decode_tokens, "timing": "sim"}
