"""The step log: fixed-size binary records that ``engines.vllm_steps`` writes inside the engine
core, and the reader the frontend uses.  Pure Python, no vLLM: a frontend reads what another
process wrote."""

from __future__ import annotations

import os
import struct

from prefixstudy.engines.base import IterationSample

ENV = "PREFIXSTUDY_STEP_LOG"  # the file the engine core appends to
# start, end (monotonic s); prefill, cached, queried, decode, context, n_prefill_reqs,
# n_decode_reqs, sampled, running, waiting; kv usage.  Order = IterationSample's fields.
RECORD = struct.Struct("<2d10qd")


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
