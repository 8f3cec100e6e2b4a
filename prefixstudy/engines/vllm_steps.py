"""Step timing inside vLLM's engine core: a Scheduler subclass that stamps every engine step.

The StatLogger the frontend sees fires once per batch of outputs, in another process, so the gap
between two of its records includes whatever idle time came before the step (up to seconds at low
load).  Here the scheduler itself writes one fixed-size record per step that computed tokens:

* ``start``: the later of this step's ``schedule()`` call and the previous step's end, so idle
  time (the engine blocked on an empty queue) is never inside a step, and with async scheduling
  (step N+1 is scheduled while N runs) consecutive steps do not overlap;
* ``end``: when ``update_from_output()`` has processed the model's output, i.e. the step's tokens
  are ready to be sent;
* what the step computed: prompt tokens (prefill), prompt tokens served from the prefix cache to
  requests first scheduled in it, decode tokens, the KV context they attend to, and the queue.

Records go to the file named by ``PREFIXSTUDY_STEP_LOG`` in the engine core's environment, one
``os.write`` per step (a few microseconds; unbuffered, so a step's record is on disk before its
tokens reach the client).  The engine core runs in its own process, on the same host and the same
monotonic clock as the frontend that reads the file.  This module imports vLLM at import time: only
the engine core imports it, by the qualified name ``engine_args`` puts in the scheduler config.
"""

from __future__ import annotations

import os
import time

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler

from prefixstudy.engines.step_log import ENV, RECORD


class _StepTiming:
    """Mixin for vLLM's Scheduler and AsyncScheduler (whichever the engine config chose)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        path = os.environ.get(ENV)
        self._step_fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600) if path else None
        self._step_pending: dict[int, tuple] = {}
        self._step_last_end = 0.0

    def schedule(self, *args, **kwargs):
        t = time.monotonic()
        out = super().schedule(*args, **kwargs)
        if self._step_fd is not None and out.total_num_scheduled_tokens > 0:
            self._step_pending[id(out)] = (t, *self._step_counts(out))
        return out

    def _step_counts(self, out) -> tuple:
        """After super().schedule(): num_computed_tokens already includes this step's tokens."""
        prefill = decode = context = n_prefill = n_decode = sampled = 0
        for req_id, n in out.num_scheduled_tokens.items():
            req = self.requests[req_id]
            after = req.num_computed_tokens
            p = max(0, min(after, req.num_prompt_tokens) - (after - n))
            prefill, decode, context = prefill + p, decode + n - p, context + after
            n_prefill += p > 0
            n_decode += n > p
            sampled += after >= req.num_prompt_tokens  # the prompt is done: a token is sampled
        new = out.scheduled_new_reqs
        cached = sum(r.num_computed_tokens for r in new)  # computed before the first step: cache hits
        queried = sum(self.requests[r.req_id].num_prompt_tokens for r in new if r.req_id in self.requests)
        return (prefill, cached, queried, decode, context, n_prefill, n_decode, sampled,
                len(self.running), len(self.waiting), float(self.kv_cache_manager.usage))

    def update_from_output(self, scheduler_output, model_runner_output):
        result = super().update_from_output(scheduler_output, model_runner_output)
        pending = self._step_pending.pop(id(scheduler_output), None)
        if pending is not None:
            end = time.monotonic()
            start = max(pending[0], self._step_last_end)
            self._step_last_end = end
            os.write(self._step_fd, RECORD.pack(start, end, *pending[1:]))
        return result


class StepTimingScheduler(_StepTiming, Scheduler):
    pass


class AsyncStepTimingScheduler(_StepTiming, AsyncScheduler):
    pass


__all__ = ["AsyncStepTimingScheduler", "StepTimingScheduler"]
