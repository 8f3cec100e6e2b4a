"""Stage: input.  ``vllm bench serve`` result JSON read back as peer points (``peer_points``), for
overlaying a peer measurement on the figures: one object, a list, ``--append-result`` lines or a
sweep's summary.json; files, folders or globs.  The export that writes such files is
``bench_json``.
"""

from __future__ import annotations

import glob
import json
import logging
import math
from pathlib import Path
from typing import Any

import pandas as pd

from prefixstudy.errors import UserError, read_text

log = logging.getLogger(__name__)


def load_bench(path: str | Path) -> list[dict[str, Any]]:
    """Read a vllm-bench-serve result file: one JSON object, a list, or one object per line."""
    path = Path(path)
    text = read_text(path, "peer result file", "a vllm bench serve result JSON")
    try:
        data = json.loads(text)
        items = data if isinstance(data, list) else [data]
    except json.JSONDecodeError:
        items = []
        for i, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    items.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise UserError(f"{path}: line {i}: invalid JSON ({e.msg})") from None
    for i, it in enumerate(items):
        if not isinstance(it, dict) or "request_rate" not in it:
            raise UserError(f"{path}: entry {i + 1} is not a vllm bench serve result (no 'request_rate')")
    if not items:
        raise UserError(f"{path}: empty peer result file")
    return items


def bench_files(paths) -> list[Path]:
    """Files named by ``paths`` (one or many): a file as it is, a folder's ``*.json`` (recursively,
    so a `bench sweep` folder's summary.json files too), a glob's matches.  Sorted, no repeats."""
    out: list[Path] = []
    for item in [paths] if isinstance(paths, (str, Path)) else paths:
        p = Path(item)
        if p.is_dir():
            found = sorted(p.rglob("*.json"))
            # A `bench sweep` folder holds each run twice: run=N.json and the list in summary.json.
            sweeps = {f.parent for f in found if f.name == "summary.json"}
            found = [f for f in found if not (f.parent in sweeps and f.name.startswith("run="))]
        elif any(c in str(item) for c in "*?["):
            found = sorted(Path(x) for x in glob.glob(str(item), recursive=True))
        else:
            found = [p]
        if not found:
            raise UserError(f"{item}: no vllm bench serve result files there")
        out += [f for f in found if f not in out]
    return out


def _caching_flag(r: dict) -> bool | None:
    """ON/OFF from the file: vLLM's serve argument (a sweep, or --metadata), else our own key."""
    for key in ("enable_prefix_caching", "prefix_caching"):
        v = r.get(key)
        if isinstance(v, bool):
            return v
        if isinstance(v, str) and v.lower() in ("true", "false"):
            return v.lower() == "true"
    return None


def _hit_rate(r: dict) -> float:
    """The prefix-cache hit rate a result file records (share of prompt tokens), NaN where none:
    ``prefix_cache_hits`` / ``prefix_cache_queries`` (the server's counters over the run),
    ``total_cached_tokens`` / ``total_input_tokens`` (per-request usage), or ``prefix_cache_hit_rate``."""
    for num, den in (("prefix_cache_hits", "prefix_cache_queries"), ("total_cached_tokens", "total_input_tokens")):
        a, b = r.get(num), r.get(den)
        if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b > 0:
            return float(a) / float(b)
    v = r.get("prefix_cache_hit_rate")
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else math.nan


def warm_peers(peers: pd.DataFrame, bound: float, tolerance: float) -> list[str]:
    """Peer files whose cache was warm before they ran, one sentence each: a point whose hit rate
    is above what the dataset allows (``bound``: the study's infinite-cache hit rate on the same
    workload; 0 for a file with caching off) by more than ``tolerance``.  Its cache held prompts of
    an earlier run (a sweep against one server without resets, a seed replayed), so its latency is
    a warm cache's, not the point's."""
    out = []
    for label, file_points in peers.groupby("label", sort=False):
        g = file_points[file_points["hit_rate"].notna()]
        limit = 0.0 if g["prefix_caching"].eq(False).all() and len(g) else bound
        over = g[g["hit_rate"] > limit + tolerance]
        if over.empty:
            continue
        first = over.iloc[0]
        which = "its first point" if first.name == g.index[0] else "a point"
        out.append(f"peer {label}: {which}, at {first['rate']:g} req/s, hit {first['hit_rate']:.3f} of its prompt "
                   f"tokens in the prefix cache, above the dataset's bound {limit:.3f}: its cache was warm before "
                   f"it ran (warm-cache contamination; {len(over)} of {len(g)} points with a hit rate are above)")
    return out


def peer_points(paths, label: str | None = None) -> pd.DataFrame:
    """Peer files, folders or globs -> label, rate, rate_is_achieved, prefix_caching, hit_rate (a
    share of prompt tokens, NaN where the file has none: ``_hit_rate``), and mean/median/p90/p99 of
    ttft, e2e and tpot (ms).

    A result at ``request_rate: "inf"`` is placed at its achieved request_throughput.  The label
    is ``label``, else the file's own, else the file name; with a caching flag (ON/OFF) that the
    label does not already say, " ON" / " OFF" is added.  Our E2E columns are named ``*_e2e_ms``;
    vLLM's ``*_e2el_ms`` map onto them.  A file without E2E percentiles (vLLM's default
    ``--percentile-metrics`` is ttft,tpot,itl) is named in a warning; those columns stay NaN.
    """
    rows = []
    for path in bench_files(paths):
        no_e2e = False
        for r in load_bench(path):
            rate = r.get("request_rate")
            achieved = isinstance(rate, str) or rate is None or not math.isfinite(float(rate))
            x = r.get("request_throughput") if achieved else rate
            if x is None:
                continue
            flag = _caching_flag(r)
            lab = str(label or r.get("label") or path.stem)
            if flag is not None and not lab.upper().endswith((" ON", " OFF", "-ON", "-OFF")):
                lab = f"{lab} {'ON' if flag else 'OFF'}"
            row = {"label": lab, "rate": float(x), "rate_is_achieved": achieved, "prefix_caching": flag,
                   "hit_rate": _hit_rate(r)}
            for ours, theirs in (("ttft", "ttft"), ("e2e", "e2el"), ("tpot", "tpot")):
                for stat in ("mean", "median", "p90", "p99"):
                    v = r.get(f"{stat}_{theirs}_ms")
                    row[f"{stat}_{ours}_ms"] = float(v) if v is not None else math.nan
            no_e2e |= "p99_e2el_ms" not in r
            rows.append(row)
        if no_e2e:
            log.warning("warning: %s has no E2E percentiles (vLLM's default --percentile-metrics is "
                        "ttft,tpot,itl; add e2el); its p90/p99 E2E are left empty", path)
    return pd.DataFrame(rows)
