"""A point's plan: its rows, each one's parent and send offset (``point_plan``), and the warm-up
requests sent before it.  The runner and the simulator (``sim.sessions``) both follow it."""

from __future__ import annotations

import numpy as np

from prefixstudy.runner import arrivals
from prefixstudy.config import StudyConfig
from prefixstudy.workloads.base import DatasetRow
from prefixstudy.workloads.trace import trace_offsets


def warmup_rows(rows: list[DatasetRow], prefixes: dict[int, list[int]], n: int,
                token_range: tuple[int, int]) -> list[DatasetRow]:
    """Same group prefixes, fresh suffixes drawn from ``token_range`` [lo, hi): warm-ups must not
    pre-cache measured suffixes.  Only first turns serve as models (a later turn's row holds just
    its new user tokens).  The runner and the simulator (``sim.sessions``) both send these."""
    rng = np.random.default_rng(10_007)
    lo, hi = token_range
    firsts = [r for r in rows if r.parent < 0]
    out = []
    for i in range(n):
        base = firsts[i % len(firsts)]
        keep = len(prefixes.get(base.group, []))
        suffix = rng.integers(lo, hi, size=len(base.prompt_token_ids) - keep).tolist()
        out.append(DatasetRow(f"warmup{i}", base.prompt_token_ids[:keep] + suffix, base.output_len, base.group))
    return out


def point_plan(cfg: StudyConfig, dataset: list[DatasetRow], rate: float,
               repeat: int) -> tuple[list[DatasetRow], list[int], np.ndarray]:
    """A point's rows, each one's parent (point index, -1: none) and send offsets (s; NaN for
    later turns, which are sent when their parent finishes).  First turns take the arrival
    schedule in order; a trace replays its recorded times unless told to draw them.  Each repeat
    draws its own schedule; ON and OFF of one repeat the same one (they are paired by index).
    The runner and the simulator (``sim.sessions``) both follow it."""
    n, L = cfg.sweep.requests_for(rate, repeat), len(dataset)
    rows = [dataset[i % L] for i in range(n)]
    # The dataset wraps around: a parent sits as many rows back as in the dataset.
    parents = [i - (i % L - r.parent) if r.parent >= 0 else -1 for i, r in enumerate(rows)]
    d = cfg.dataset
    offsets = trace_offsets(dataset, n, rate, d.trace.replay if d.trace else "scaled") \
        if d.kind == "trace" else None
    if offsets is None:
        firsts = [i for i in range(n) if parents[i] < 0]
        offsets = np.full(n, np.nan)
        offsets[firsts] = arrivals.schedule(len(firsts), rate, cfg.arrivals.process,
                                            cfg.arrivals.burstiness, cfg.arrivals.seed + repeat)
    return rows, parents, offsets


def token_range(rows: list[DatasetRow]) -> tuple[int, int]:
    """[lo, hi) of the dataset's token ids: warm-up suffixes drawn from it stay valid ids."""
    return min(min(r.prompt_token_ids) for r in rows), max(max(r.prompt_token_ids) for r in rows) + 1
