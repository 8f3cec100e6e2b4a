"""Stage: output/input.  Points as ``vllm bench serve`` result JSON, and back.

Export writes one JSON per (mode, rate) with the field names of the result dict
that ``vllm/benchmarks/serve.py`` saves with ``--save-result`` (``completed``,
``request_throughput``, ``mean_ttft_ms``, ``p99_e2el_ms``, ...), so tools that read
vLLM's files read ours.  Only counted requests (measured, no error) enter the
latency fields, as vLLM only counts successful ones.  Differences from vLLM:

* ITL: we keep per-request ITL summaries, not every gap, so only ``mean_itl_ms``
  (token-weighted, exact) is written; median/std/p99 ITL are left out.
* ``max_output_tokens_per_s`` comes from the engine's iteration records
  (generated tokens per 1-second bucket), not from client token timestamps.
* Extra keys, which vLLM writes for ``--metadata`` too: ``prefix_caching``,
  ``prefixstudy_mode``, ``saturated``, ``device``, versions.

Import reads such files (one object, a list, or ``--append-result`` lines) into a
table for overlaying a peer measurement on the latency-vs-rate figures.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from prefixstudy.metrics.requests import counted, measured, meets_slo
from prefixstudy.errors import UserError, read_text
from prefixstudy.report.data import summary_points
from prefixstudy.results import StudyResults, write_json

BENCH_PERCENTILES = (50, 90, 99)
_VLLM_METRICS = {"ttft": "ttft_ms", "tpot": "tpot_ms", "e2el": "e2e_ms"}


def _f(x: Any) -> float | None:
    """JSON-safe float: NaN becomes null."""
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def point_result(requests: pd.DataFrame, iterations: pd.DataFrame, *, mode: str, rate: float,
                 duration_s: float, config: dict, manifest: dict, saturated: bool | None = None,
                 slo: dict[str, float] | None = None) -> dict[str, Any]:
    """One point as a vllm-bench-serve result dict.

    ``requests``/``iterations``: this point's rows only.  ``duration_s``: the point's
    duration (summary.csv's, so throughputs agree with it).
    """
    m = measured(requests)
    ok = counted(requests)
    dur = float(duration_s) if duration_s and duration_s > 0 else float("nan")
    total_in = int(ok["prompt_tokens"].sum())
    total_out = int(ok["output_tokens"].sum())
    cfg_arr = config.get("arrivals", {}) or {}
    model = str(config.get("model", ""))
    study = str(config.get("study", "prefixstudy"))
    res: dict[str, Any] = {
        "date": str(manifest.get("started_at", "")),
        # The backend that answered, as the manifest recorded it (runs before backends: vllm).
        "endpoint_type": f"{manifest.get('engine', 'vllm')}-offline",
        "backend": manifest.get("engine", "vllm"),
        "label": f"{study}-{mode}",
        "model_id": model,
        "tokenizer_id": model,
        "num_prompts": int(len(m)),
        "request_rate": float(rate),
        "burstiness": float(cfg_arr.get("burstiness", 1.0) or 1.0),
        "max_concurrency": None,
        "duration": _f(dur),
        "completed": int(len(ok)),
        "failed": int(len(m) - len(ok)),
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": _f(len(ok) / dur),
        "request_goodput": None,
        "output_throughput": _f(total_out / dur),
        "total_token_throughput": _f((total_in + total_out) / dur),
    }
    if slo:
        good = int(meets_slo(requests, slo).sum())
        res["request_goodput"] = _f(good / dur)
    res.update(_peaks(ok, iterations))
    res.update(_latency_fields(ok))
    res.update(_extras(config, manifest, mode, saturated))
    return res


def _latency_fields(ok: pd.DataFrame) -> dict[str, Any]:
    """vLLM's latency fields over counted requests: mean/median/std/percentiles of ttft, tpot, e2el."""
    res: dict[str, Any] = {}
    for name, col in _VLLM_METRICS.items():
        v = ok[col].to_numpy(float)
        if name == "tpot":  # vLLM only counts tpot for requests with > 1 output token
            v = v[ok["output_tokens"].to_numpy() > 1]
        v = v[np.isfinite(v)]
        res[f"mean_{name}_ms"] = _f(v.mean()) if v.size else 0.0
        res[f"median_{name}_ms"] = _f(np.median(v)) if v.size else 0.0
        res[f"std_{name}_ms"] = _f(v.std()) if v.size else 0.0
        for p in BENCH_PERCENTILES:
            res[f"p{p}_{name}_ms"] = _f(np.percentile(v, p)) if v.size else 0.0
        if name == "tpot":
            res["mean_itl_ms"] = _mean_itl(ok)
    return res


def _extras(config: dict, manifest: dict, mode: str, saturated: bool | None) -> dict[str, Any]:
    """Our keys beyond vLLM's (it writes --metadata ones the same way)."""
    cfg_ds = config.get("dataset", {}) or {}
    return {
        "prefix_caching": mode == "on",
        "prefixstudy_mode": mode,
        "saturated": None if saturated is None else bool(saturated),
        "prefix_len": cfg_ds.get("prefix_len"),
        "suffix_len": cfg_ds.get("suffix_len"),
        "output_len": cfg_ds.get("output_len"),
        "tensor_parallel_size": (config.get("engine", {}) or {}).get("tensor_parallel_size"),
        "device": manifest.get("device"),
        "vllm_version": manifest.get("vllm_version"),
        "prefixstudy_version": manifest.get("prefixstudy_version"),
    }


def _mean_itl(ok: pd.DataFrame) -> float:
    """Mean over all inter-token gaps: per-request means weighted by their gap count."""
    n = (ok["output_tokens"].to_numpy(float) - 1).clip(min=0)
    v = ok["itl_mean_ms"].to_numpy(float)
    keep = np.isfinite(v) & (n > 0)
    return _f((v[keep] * n[keep]).sum() / n[keep].sum()) if keep.any() else 0.0


def _peaks(ok: pd.DataFrame, iterations: pd.DataFrame) -> dict[str, Any]:
    tok = 0.0
    if len(iterations):
        sec = np.floor(iterations["t_s"].to_numpy(float))
        g = iterations["generation_tokens"].to_numpy(float)
        keep = np.isfinite(sec)
        if keep.any():
            tok = float(pd.Series(g[keep]).groupby(sec[keep]).sum().max())
    conc = 0
    if len(ok):
        start = np.floor(ok["sent_s"].to_numpy(float)).astype(int)
        end = np.floor(ok["sent_s"].to_numpy(float) + ok["e2e_ms"].to_numpy(float) / 1000).astype(int)
        lo = start.min()
        delta = np.zeros(end.max() - lo + 2)
        np.add.at(delta, start - lo, 1)
        np.add.at(delta, end - lo + 1, -1)
        conc = int(np.cumsum(delta).max())
    return {"max_output_tokens_per_s": tok, "max_concurrent_requests": conc}


def bench_filename(config: dict, mode: str, rate: float) -> str:
    model = str(config.get("model", "model")).rstrip("/").split("/")[-1] or "model"
    study = str(config.get("study", "prefixstudy"))
    return f"{study}-{mode}-{rate:g}qps-{model}.json"


def export_bench(study: StudyResults, out_dir: Path | None = None, points: pd.DataFrame | None = None,
                 slo: dict[str, float] | None = None) -> list[Path]:
    """Write one vllm-bench-serve JSON per finished point into ``out_dir`` (default RESULTS/bench).

    ``points``: mode, rate, duration_s, saturated; by default summary.csv's finished points.
    """
    out_dir = Path(out_dir) if out_dir else study.path / "bench"
    if points is None:
        points = summary_points(study)
        points = points[points["status"] != "failed"]
    if points.empty:
        raise UserError(f"{study.path}: no finished points to export")
    paths = []
    for _, p in points.sort_values(["mode", "rate"]).iterrows():
        mode, rate = str(p["mode"]), float(p["rate"])
        req = study.requests[(study.requests["mode"] == mode) & np.isclose(study.requests["rate"], rate)]
        it = study.iterations[(study.iterations["mode"] == mode) & np.isclose(study.iterations["rate"], rate)]
        sat = p.get("saturated")
        res = point_result(req, it, mode=mode, rate=rate, duration_s=float(p["duration_s"]),
                           config=study.config, manifest=study.manifest,
                           saturated=None if sat is None or pd.isna(sat) else bool(sat), slo=slo)
        path = out_dir / bench_filename(study.config, mode, rate)
        write_json(path, res)
        paths.append(path)
    return paths


# ----------------------------------------------------------------- import

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


def peer_points(paths, label: str | None = None) -> pd.DataFrame:
    """Peer files -> label, rate, rate_is_achieved, mean/median/p90/p99 of ttft and e2e (ms).

    A result at ``request_rate: "inf"`` is placed at its achieved request_throughput.
    Our E2E columns are named ``*_e2e_ms``; vLLM's ``*_e2el_ms`` map onto them.
    """
    rows = []
    for path in [paths] if isinstance(paths, (str, Path)) else paths:
        for r in load_bench(path):
            rate = r.get("request_rate")
            achieved = isinstance(rate, str) or rate is None or not math.isfinite(float(rate))
            x = r.get("request_throughput") if achieved else rate
            if x is None:
                continue
            lab = label or r.get("label") or Path(path).stem
            row = {"label": str(lab), "rate": float(x), "rate_is_achieved": achieved,
                   "prefix_caching": r.get("prefix_caching")}
            for ours, theirs in (("ttft", "ttft"), ("e2e", "e2el"), ("tpot", "tpot")):
                for stat in ("mean", "median", "p90", "p99"):
                    v = r.get(f"{stat}_{theirs}_ms")
                    row[f"{stat}_{ours}_ms"] = float(v) if v is not None else math.nan
            rows.append(row)
    return pd.DataFrame(rows)
