"""The step log: fixed-size binary records that ``engines.vllm_steps`` writes inside the engine
core, and the reader the frontend uses.  Pure Python, no vLLM: a frontend reads what another
process wrote."""

from __future__ import annotations

import gzip
import os
import struct

from prefixstudy.engines.base import IterationSample

ENV = "PREFIXSTUDY_STEP_LOG"  # the file the engine core appends to
# start, end (monotonic s); prefill, cached, queried, decode, context, n_prefill_reqs,
# n_decode_reqs, sampled, running, waiting; kv usage; the step's span on the GPU in ms (NaN where
# the engine has no GPU timer).  Order = IterationSample's fields.
RECORD = struct.Struct("<2d10qdd")

TRACE_ENV = "PREFIXSTUDY_STEP_TRACE"  # optional: the file the engine core appends trace events to
# event, t (monotonic s; for "gpu_span" the step's CUDA-event span in s), step number, prompt
# tokens, all tokens of that step
TRACE = struct.Struct("<Bdqqq")
TRACE_EVENTS = ("schedule_start", "schedule_end", "executed", "update_start", "update_end", "gpu_span")
# Set in the engine core's environment when its executor records CUDA events around each step
# (engines.vllm_gpu_timer): each record, and the trace if there is one, gets the step's GPU span.
GPU_SPANS_ENV = "PREFIXSTUDY_STEP_GPU_SPANS"

# What a step record's span means, by the ``timing`` label its rows carry; saved in the manifest.
TIMING_METHODS = {
    "engine": "scheduler stamps in the engine core, one step at a time (async scheduling off): from "
              "schedule() (or the previous step's end) to update_from_output(); the span holds this "
              "step's scheduling, launch, GPU work and output processing, and no other step's",
    "engine-async": "scheduler stamps in the engine core with async scheduling on: a record runs from the "
                    "previous record's end to update_from_output(), and holds the next step's scheduling "
                    "and launch, while part of its own GPU work runs under the record before; not a "
                    "per-step cost, not fitted",
    "gpu-span": "the step's span on the GPU (vLLM's default engine, async scheduling included): from a CUDA "
                "event recorded before its inputs are prepared to one after its sampling is launched, on "
                "the model runner's stream, so it starts when the previous step's GPU work ends and holds "
                "launch bubbles but no other step's work; the host stamps stay in host_step_ms",
    "frontend": "StatLogger records at the frontend: gaps between output batches, idle time included",
    "request": "one row per request (no engine steps)",
    "sim": "the simulator's own steps",
}


def read_steps(path: str, offset: int = 0) -> tuple[list[IterationSample], int]:
    """The whole records from byte ``offset`` on, and the offset after the last whole one (a record
    being written while we read is left for the next call)."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return [], offset
    n = len(data) // RECORD.size
    steps = [IterationSample(*r) for r in RECORD.iter_unpack(data[: n * RECORD.size])]
    return steps, offset + n * RECORD.size


def size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except FileNotFoundError:
        return 0


def read_trace(path: str) -> list[tuple[str, float, int, int, int]]:
    """The trace events (name, t, step number, prompt tokens, all tokens), in the order written
    (a ``.gz`` path is read through gzip: a trace kept beside results)."""
    try:
        with (gzip.open if path.endswith(".gz") else open)(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return []
    n = len(data) // TRACE.size
    return [(TRACE_EVENTS[e], t, seq, p, tot) for e, t, seq, p, tot in TRACE.iter_unpack(data[: n * TRACE.size])]
