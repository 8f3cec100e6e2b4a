"""Step timing inside vLLM's engine core: a Scheduler subclass that stamps every engine step.

The StatLogger the frontend sees fires once per batch of outputs, in another process, so the gap
between two of its records includes whatever idle time came before the step (up to seconds at low
load).  Here the scheduler itself writes one fixed-size record per step that computed tokens:

* ``start``: the later of this step's ``schedule()`` call and the previous step's end, so idle
  time (the engine blocked on an empty queue) is never inside a step;
* ``end``: when ``update_from_output()`` has processed the model's output, i.e. the step's tokens
  are ready to be sent;
* what the step computed: prompt tokens (prefill), prompt tokens served from the prefix cache to
  requests first scheduled in it, decode tokens, the KV context they attend to, and the queue.

These stamps bound one step's work only when the engine runs one step at a time
(``EngineCore.step``: schedule, execute, wait, update).  With async scheduling vLLM's engine core
runs ``step_with_batch_queue`` with two batches in flight: it schedules step N+1 and, in process
(``UniProcExecutor`` runs the worker in the engine core's own thread), prepares and launches N+1's
forward and sampling before it waits for N's output and calls ``update_from_output`` for N (vLLM
0.26 ``v1/engine/core.py`` ``step_with_batch_queue``; ``v1/executor/uniproc_executor.py``
``collective_rpc`` runs the method in line).  Executors whose workers are other processes (Ray, mp)
do not run N+1's ``execute_model`` in this thread.  N's
record then holds N+1's host-side scheduling and launch (long for a prefill run outside the full
CUDA graphs), and N+1's GPU work runs under N's record, leaving N+1's own record short.  So the
host stamps of an async engine are not per-step costs.  Where the engine core runs the worker in
its own thread on a GPU (vLLM's default engine on one GPU), ``engines.vllm_gpu_timer`` brackets each
step with CUDA events and every record carries the step's span on the GPU, which is its cost
whether or not scheduling is async (rows timed ``gpu-span``); elsewhere an async engine's rows are
labelled ``engine-async`` and not fitted.

Records go to the file named by ``PREFIXSTUDY_STEP_LOG`` in the engine core's environment, one
``os.write`` per step (a few microseconds; unbuffered, so a step's record is on disk before its
tokens reach the client).  ``PREFIXSTUDY_STEP_TRACE``, if set, names a second file that gets one
``step_log.TRACE`` event per scheduler call (schedule entry and exit, the grammar-bitmask call that
the engine core makes right after ``execute_model`` returns, update entry and exit): what the
engine core's thread did between two records, to see which work lands in which.  The engine core
runs in its own process, on the same host and the same monotonic clock as the frontend that reads
the files.  This module imports vLLM at import time: only the engine core imports it, by the
qualified name ``engine_args`` puts in the scheduler config.
"""

from __future__ import annotations

import math
import os
import time

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler

from prefixstudy.engines.step_log import ENV, GPU_SPANS_ENV, RECORD, TRACE, TRACE_ENV


class _StepTiming:
    """Mixin for vLLM's Scheduler and AsyncScheduler (whichever the engine config chose)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        path = os.environ.get(ENV)
        self._step_fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600) if path else None
        self._step_pending: dict[int, tuple] = {}
        self._step_last_end = 0.0
        trace = os.environ.get(TRACE_ENV)
        self._trace_fd = os.open(trace, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600) if trace else None
        # id(scheduler output) -> (its step number, prompt tokens, all tokens) while it is in flight
        self._trace_steps: dict[int, tuple[int, int, int]] = {}
        self._trace_n = 0
        self._gpu_spans = None
        if os.environ.get(GPU_SPANS_ENV):
            from prefixstudy.engines.vllm_gpu_timer import gpu_span_ms  # torch: GPU engines only

            self._gpu_spans = gpu_span_ms

    def _trace(self, event: int, out, t: float) -> None:
        os.write(self._trace_fd, TRACE.pack(event, t, *self._trace_steps[id(out)]))

    def schedule(self, *args, **kwargs):
        t = time.monotonic()
        out = super().schedule(*args, **kwargs)
        if self._step_fd is not None and out.total_num_scheduled_tokens > 0:
            self._step_pending[id(out)] = (t, *self._step_counts(out))
        if self._trace_fd is not None and out.total_num_scheduled_tokens > 0:
            prefill = self._step_pending[id(out)][1] if id(out) in self._step_pending else 0
            self._trace_steps[id(out)] = (self._trace_n, prefill, out.total_num_scheduled_tokens)
            self._trace_n += 1
            self._trace(0, out, t)
            self._trace(1, out, time.monotonic())
        return out

    def get_grammar_bitmask(self, scheduler_output, *args, **kwargs):
        # The engine core calls this right after execute_model() returned for this output.
        if self._trace_fd is not None and id(scheduler_output) in self._trace_steps:
            self._trace(2, scheduler_output, time.monotonic())
        return super().get_grammar_bitmask(scheduler_output, *args, **kwargs)

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
        if self._trace_fd is not None and id(scheduler_output) in self._trace_steps:
            self._trace(3, scheduler_output, time.monotonic())
        result = super().update_from_output(scheduler_output, model_runner_output)
        end = time.monotonic()
        # The step's output is in, so its closing CUDA event is done: taking the span waits for nothing.
        ms = self._gpu_spans(id(scheduler_output)) if self._gpu_spans is not None else None
        pending = self._step_pending.pop(id(scheduler_output), None)
        if pending is not None:
            start = max(pending[0], self._step_last_end)
            self._step_last_end = end
            os.write(self._step_fd, RECORD.pack(start, end, *pending[1:], math.nan if ms is None else ms))
        if self._trace_fd is not None and id(scheduler_output) in self._trace_steps:
            self._trace(4, scheduler_output, time.monotonic())
            if ms is not None:
                self._trace(5, scheduler_output, ms / 1e3)
            del self._trace_steps[id(scheduler_output)]
        return result


class StepTimingScheduler(_StepTiming, Scheduler):
    pass


class AsyncStepTimingScheduler(_StepTiming, AsyncScheduler):
    pass


__all__ = ["AsyncStepTimingScheduler", "StepTimingScheduler"]
