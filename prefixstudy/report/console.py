"""The table `prefixstudy run` prints at the end: what a `vllm bench serve` user reads first, for
every point (mode, rate and repeat) of the run: requests, duration, request and output-token
throughput, and the mean, median and p99 of TTFT, TPOT and E2E."""

from __future__ import annotations

import math

import pandas as pd

# (header, summary column stem) of each mean/p50/p99 triple
_TRIPLES = (("TTFT", "ttft"), ("TPOT", "tpot"), ("E2E", "e2e"))


def _num(v, fmt: str) -> str:
    try:
        v = float(v)
    except (TypeError, ValueError):
        return "-"
    return "-" if math.isnan(v) else format(v, fmt)


def _triple(row, key: str) -> str:
    return "/".join(_num(row.get(f"{s}_{key}_ms"), ".1f") for s in ("mean", "p50", "p99"))


def bench_table(summary: pd.DataFrame) -> list[str]:
    """The table's lines for a run's summary.csv rows (none for an empty summary).  Rates are the
    sweep's; ``req/s`` is the achieved request throughput, as `vllm bench serve` reports it."""
    if summary is None or summary.empty:
        return []
    repeats = "repeat" in summary and summary["repeat"].nunique() > 1
    head = ["mode", "rate"] + (["rep"] if repeats else []) + ["ok/sent", "dur s", "req/s", "out tok/s"] \
        + [f"{name} ms mean/p50/p99" for name, _ in _TRIPLES]
    rows = []
    for _, r in summary.iterrows():
        rows.append([str(r["mode"]).upper(), f"{float(r['rate']):g}"]
                    + ([str(int(r["repeat"]))] if repeats else [])
                    + [f"{int(r['n_ok'])}/{int(r['n_sent'])}", _num(r.get("duration_s"), ".1f"),
                       _num(r.get("achieved_rate"), ".2f"), _num(r.get("output_tok_s"), ".1f")]
                    + [_triple(r, key) for _, key in _TRIPLES])
    widths = [max(len(x) for x in col) for col in zip(head, *rows, strict=True)]

    def line(cells: list[str]) -> str:
        # Text columns to the left, numbers to the right.
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True)))

    return [line(head), *(line(r) for r in rows)]
