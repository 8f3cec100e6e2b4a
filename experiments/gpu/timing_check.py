"""Checks a study's step records against the invariant that shifted ones break, and reads an engine
core step trace (``PREFIXSTUDY_STEP_TRACE``, engines.vllm_steps).

    python experiments/gpu/timing_check.py steps RUN_DIR [RUN_DIR ...]
    python experiments/gpu/timing_check.py trace TRACE_FILE [TRACE_FILE ...]
    python experiments/gpu/timing_check.py split TRACE_FILE [TRACE_FILE ...]
    python experiments/gpu/timing_check.py gpu TRACE_FILE [TRACE_FILE ...]

``steps``: per mode, each step that computed prompt tokens right after a decode-only step that ran
at least as many decode requests (the same batch or a smaller one, so the later step has at least
as much work).  Such a step is "faster" when it took less than the decode-only step before it minus
1 ms (noise: decode-only steps of one batch size vary by well under 1 ms on one H200).  A correct
timer gives none, or a handful at a point where the host was interrupted.
``split``: for each decode-only record followed by a step with prompt tokens, the engine core
thread's time inside that record, part by part (``split_table``).
``gpu``: a trace with CUDA-event spans (engines.vllm_gpu_timer, on one GPU in process): per step kind the
median GPU span and host record, and the check above on both.
``trace``: per step kind (decode-only, prompt only, prompt and decode), the engine core thread's time from
scheduling the step to ``execute_model`` returning (host-side prepare and launch), and from that
to the update of the step before it (with async scheduling: waiting for the previous step's output).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

from prefixstudy.engines.step_log import read_trace
from prefixstudy.metrics import step_checks
from prefixstudy.schema import typed_iterations

NOISE_MS = 1.0


def check_steps(run: Path) -> pd.DataFrame:
    it = typed_iterations(pd.read_parquet(run / "iterations.parquet"))
    pairs = step_checks.pairs(step_checks.engine_rows(it))  # the pairwise check's pairs (metrics.step_checks)
    out = []
    for (mode, rate), g in pairs.groupby(["mode", "rate"]):
        faster = g["prefill_ms"] < g["decode_ms"] - NOISE_MS
        shifted = (g["prefill_ms"] < 12) & (g["decode_ms"] > 20)
        s = it[(it["mode"] == mode) & (it["rate"] == rate)]
        out.append({"mode": mode, "rate": rate, "pairs": len(g), "prefill_faster": int(faster.sum()),
                    "prefill_lt12_after_decode_gt20": int(shifted.sum()),
                    "median_prefill_step_ms": round(float(s.loc[s["prefill_tokens"] > 0, "step_ms"].median()), 2),
                    "median_decode_only_step_ms": round(float(s.loc[s["prefill_tokens"] == 0, "step_ms"].median()), 2)})
    return pd.DataFrame(out)


def trace_table(path: str) -> pd.DataFrame:
    ev = pd.DataFrame(read_trace(path), columns=["event", "t", "step", "prefill", "tokens"])
    t = ev.pivot_table(index="step", columns="event", values="t", aggfunc="first")
    g = ev.groupby("step")[["prefill", "tokens"]].first()
    kind = pd.Series(np.where(g["prefill"] == 0, "decode-only",
                              np.where(g["tokens"] == g["prefill"], "prompt only", "prompt and decode")), index=g.index)
    launch_ms = (t["executed"] - t["schedule_end"]) * 1e3
    # One step at a time: a step's update follows its own execution (the wait is its GPU work).
    # With the batch queue: the update of step N-1 follows the launch of step N.
    own_ms = (t["update_start"] - t["executed"]) * 1e3
    prev_ms = (t["update_start"].shift(1) - t["executed"]) * 1e3
    df = pd.DataFrame({"kind": kind, "launch_ms": launch_ms, "own_ms": own_ms, "prev_ms": prev_ms})
    return df.groupby("kind").agg(steps=("launch_ms", "size"), execute_model_ms_median=("launch_ms", "median"),
                                  execute_model_ms_p90=("launch_ms", lambda x: np.nanpercentile(x, 90)),
                                  to_own_update_ms_median=("own_ms", "median"),
                                  to_prev_update_ms_median=("prev_ms", "median")).round(2)


def split_table(path: str) -> pd.DataFrame:
    """Where the time of a decode-only record N goes when the next step N+1 computes prompt tokens
    (medians over such pairs, ms): the engine core thread, in order, schedules N+1, runs N+1's
    execute_model, launches N+1's sampling and waits for N's output, then updates from N's output."""
    ev = pd.DataFrame(read_trace(path), columns=["event", "t", "step", "prefill", "tokens"])
    t = ev.pivot_table(index="step", columns="event", values="t", aggfunc="first").sort_index()
    p = ev.groupby("step")["prefill"].first().reindex(t.index)
    prev, cur, nxt = t.shift(1), t, t.shift(-1)
    record_start = np.maximum(prev["update_end"], cur["schedule_start"])
    pair = (p == 0) & (p.shift(-1) > 0) & (nxt["schedule_start"] <= cur["update_start"])  # N+1 launched first
    ms = pd.DataFrame({
        "record_N": cur["update_end"] - record_start,
        "before_schedule_next": nxt["schedule_start"] - record_start,
        "schedule_next": nxt["schedule_end"] - nxt["schedule_start"],
        "execute_model_next": nxt["executed"] - nxt["schedule_end"],
        "sample_next_and_wait_N": cur["update_start"] - nxt["executed"],
        "update_N": cur["update_end"] - cur["update_start"],
        "record_next": nxt["update_end"] - cur["update_end"]})[pair] * 1e3
    out = ms.median().round(2).to_frame("median_ms").T
    out.insert(0, "pairs", int(pair.sum()))
    return out


def trace_rows(path: str, mode: str) -> pd.DataFrame:
    """A step trace with GPU spans as iteration rows (``timing`` gpu-span): step_ms the CUDA-event
    span, host_step_ms the scheduler's record, for ``metrics.step_checks``.  The trace has no point
    boundaries; the checks' back-to-back condition keeps pairs within one point."""
    ev = pd.DataFrame(read_trace(path), columns=["event", "t", "step", "prefill", "tokens"])
    t = ev.pivot_table(index="step", columns="event", values="t", aggfunc="first").sort_index()
    g = ev.groupby("step")[["prefill", "tokens"]].first().reindex(t.index)
    start = np.maximum(t["update_end"].shift(1).fillna(0.0), t["schedule_start"])
    return pd.DataFrame({"mode": mode, "rate": 0.0, "repeat": 0, "timing": "gpu-span",
                         "step_start_s": start.to_numpy(), "t_s": t["update_end"].to_numpy(),
                         "step_ms": (t["gpu_span"] * 1e3).to_numpy(),
                         "host_step_ms": ((t["update_end"] - start) * 1e3).to_numpy(),
                         "prefill_tokens": g["prefill"].to_numpy(), "decode_tokens": (g["tokens"] - g["prefill"]).to_numpy()}
                        ).dropna(subset=["step_ms"]).reset_index(drop=True)


def gpu_table(path: str) -> pd.DataFrame:
    """Each step's CUDA-event span against its host record, and the prefill-after-decode check on each."""
    ev = pd.DataFrame(read_trace(path), columns=["event", "t", "step", "prefill", "tokens"])
    t = ev.pivot_table(index="step", columns="event", values="t", aggfunc="first").sort_index()
    g = ev.groupby("step")[["prefill", "tokens"]].first().reindex(t.index)
    d = pd.DataFrame({"gpu_ms": t["gpu_span"] * 1e3,
                      "record_ms": (t["update_end"] - np.maximum(t["update_end"].shift(1), t["schedule_start"])) * 1e3,
                      "prefill": g["prefill"], "decode": g["tokens"] - g["prefill"]})
    d["kind"] = np.where(d["prefill"] == 0, "decode-only", np.where(d["decode"] == 0, "prompt only", "prompt and decode"))
    prev = d.shift(1)
    pair = (prev["prefill"] == 0) & (d["prefill"] > 0) & (d["decode"] >= prev["decode"])
    out = d.groupby("kind").agg(steps=("gpu_ms", "size"), gpu_ms_median=("gpu_ms", "median"),
                                record_ms_median=("record_ms", "median")).round(2)
    out["pairs"] = int(pair.sum())
    out["faster_by_gpu_span"] = int((d["gpu_ms"] < prev["gpu_ms"] - NOISE_MS)[pair].sum())
    out["faster_by_record"] = int((d["record_ms"] < prev["record_ms"] - NOISE_MS)[pair].sum())
    return out


if __name__ == "__main__":
    what, *paths = sys.argv[1:]
    pd.set_option("display.width", 160)
    for p in paths:
        print(p)
        table = {"steps": lambda p=p: check_steps(Path(p)), "trace": lambda p=p: trace_table(p),
                 "split": lambda p=p: split_table(p), "gpu": lambda p=p: gpu_table(p)}
        print(table[what]().to_string(index=what in ("trace", "gpu")))
