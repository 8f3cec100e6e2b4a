"""CUDA-event spans of each engine step, for an in-process engine on one GPU.

vLLM's ``UniProcExecutor`` runs the worker in the engine core's own thread, so this subclass sees
each step's ``execute_model`` and ``sample_tokens`` calls in order.  It records a CUDA event on the
model runner's stream (the thread's current stream) before the step's inputs are prepared and
another after its sampling is launched.  On the GPU the first completes when the stream reaches it
(after the previous step's work, or at once when the GPU was idle) and the second when the step's
sampling is done, so their difference is the step's own span on the GPU, bubbles while its kernels
were still being launched included, whatever the host did meanwhile: with async scheduling it is a
per-step cost where the scheduler's host stamps are not (engines.vllm_steps).  The scheduler, in the
same thread, takes the span once the step's output is in (``gpu_span_ms``) and writes it into the
step's record (and the step trace, if one is kept).  Imports vLLM and torch: only the engine core
imports it, by the qualified name ``engines.vllm`` puts in the parallel config.
"""

from __future__ import annotations

import torch
from vllm.v1.executor.uniproc_executor import UniProcExecutor

# id(scheduler output) -> [event before its execute_model, event after its sampling]
SPANS: dict[int, list] = {}


class GpuTimedUniProcExecutor(UniProcExecutor):
    _gpu_timed_last: int | None = None

    def execute_model(self, scheduler_output, non_block: bool = False):
        if scheduler_output.total_num_scheduled_tokens > 0:
            start = torch.cuda.Event(enable_timing=True)
            start.record()
            SPANS[id(scheduler_output)] = [start, None]
            self._gpu_timed_last = id(scheduler_output)
        return super().execute_model(scheduler_output, non_block)

    def sample_tokens(self, grammar_output, non_block: bool = False):
        out = super().sample_tokens(grammar_output, non_block)
        # The engine core samples right after executing the same scheduler output.
        pair = SPANS.get(self._gpu_timed_last)
        if pair is not None and pair[1] is None:
            pair[1] = torch.cuda.Event(enable_timing=True)
            pair[1].record()
        return out


def gpu_span_ms(key: int) -> float | None:
    """The step's GPU span (ms), once its output is in; None for a step this executor did not see."""
    pair = SPANS.pop(key, None)
    if pair is None or pair[1] is None:
        return None
    pair[1].synchronize()  # recorded right after the sampling whose output is already copied back
    return float(pair[0].elapsed_time(pair[1]))


EXECUTOR = f"{__name__}.GpuTimedUniProcExecutor"
