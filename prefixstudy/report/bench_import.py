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


def peer_points(paths, label: str | None = None) -> pd.DataFrame:
    """Peer files, folders or globs -> label, rate, rate_is_achieved, prefix_caching, and
    mean/median/p90/p99 of ttft, e2e and tpot (ms).

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
            row = {"label": lab, "rate": float(x), "rate_is_achieved": achieved, "prefix_caching": flag}
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
