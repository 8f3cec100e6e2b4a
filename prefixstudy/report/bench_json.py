"""Stage: output.  Points as ``vllm bench serve`` result JSON.

Export writes one JSON per (mode, rate, repeat) with the field names and formats of the result dict
that ``vllm/benchmarks/serve.py`` (0.26) saves with ``--save-result``: ``date`` as
``%Y%m%d-%H%M%S``, ``endpoint_type`` / ``backend`` ``vllm`` (the OpenAI-completions backend),
``model_id`` the model's name (not a local path), ``request_rate`` ``"inf"`` for everything at
once, ``burstiness`` as vLLM writes it (the gamma shape, 1.0 for Poisson).  Only counted requests (measured, no error) enter
the latency fields, as vLLM only counts successful ones; ``failed`` counts errors only, and the
requests a point's cap stopped (never sent, or still open) are reported apart (``unfinished``,
``never_sent``).  With ``detailed`` (vLLM's ``--save-detailed``) the per-request arrays
``input_lens``, ``output_lens``, ``ttfts`` (s), ``start_times`` and ``errors`` are added; vLLM
0.32's ``latencies`` and ``queue_times`` are always written, as it writes them.
``layout="sweep"`` writes vLLM's ``bench sweep`` layout (``SERVE-enable_prefix_caching=True-
BENCH-request_rate=4/summary.json``), which ``vllm bench sweep plot`` reads.  Differences:

* ITL: ``mean_itl_ms`` is the token-weighted mean of the per-request means; median, std and
  percentiles of every gap come from the point's manifest entry (``itl_ms``; a run whose
  manifest lacks it has only the mean).  The per-request ``itls`` array is not written.
* ``max_output_tokens_per_s`` comes from the engine's iteration records (generated tokens per
  1-second bucket), not from client token timestamps; 0 where there are none (HTTP backends).
* Extra keys, which vLLM writes for ``--metadata`` too: ``enable_prefix_caching``,
  ``prefix_caching``, ``prefixstudy_mode``, ``saturated``, ``device``, versions, the run's metadata.

``bench_import`` reads such files (one object, a list, ``--append-result`` lines, a sweep's
summary.json; files, folders or globs) into a table for overlaying a peer measurement on the figures.
"""

from __future__ import annotations

import datetime as dt
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from prefixstudy.metrics.requests import measured, meets_slo, split_outcomes, with_repeat
from prefixstudy.errors import UserError
from prefixstudy.report.data import _as_bool, norm_rate
from prefixstudy.results import StudyResults, write_json

BENCH_PERCENTILES = (50, 90, 99)  # when the run's config has none
_VLLM_METRICS = {"ttft": "ttft_ms", "tpot": "tpot_ms", "e2el": "e2e_ms"}


def _f(x: Any) -> float | None:
    """JSON-safe float: NaN becomes null."""
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def bench_date(started_at: Any) -> str:
    """vLLM's ``date``: local time as %Y%m%d-%H%M%S, from an epoch or an ISO stamp ("" if neither)."""
    try:
        t = dt.datetime.fromtimestamp(float(started_at))
    except (TypeError, ValueError):
        try:
            t = dt.datetime.fromisoformat(str(started_at)).astimezone()
        except ValueError:
            return ""
    return t.strftime("%Y%m%d-%H%M%S")


def model_name(model: str) -> str:
    """A local folder is named by its last part (vLLM's model_id is what the user served); a hub
    id (org/name, no such folder) stays as it is."""
    p = Path(model)
    return p.name if (p.is_absolute() or p.exists() or model.startswith(".")) else model


def _percentile_key(p: float) -> str:
    return str(int(p)) if int(p) == p else str(p)  # as vLLM: p99, p99.9


def _traffic(config: dict, rate: float) -> dict[str, Any]:
    arr = config.get("arrivals", {}) or {}
    out: dict[str, Any] = {"request_rate": "inf" if math.isinf(rate) else float(rate)}
    # vLLM writes it for every run: its gamma shape, 1.0 for Poisson.  Constant arrivals have none.
    out["burstiness"] = float(arr.get("burstiness", 1.0)) if arr.get("process") == "gamma" else \
        (None if arr.get("process") == "constant" else 1.0)
    out["max_concurrency"] = (config.get("sweep", {}) or {}).get("max_concurrency")
    return out


def point_result(requests: pd.DataFrame, iterations: pd.DataFrame, *, mode: str, rate: float,
                 duration_s: float, config: dict, manifest: dict, saturated: bool | None = None,
                 slo: dict[str, float] | None = None, started_at: Any = None,
                 detailed: bool = False, itl: dict[str, float] | None = None) -> dict[str, Any]:
    """One point as a vllm-bench-serve result dict.

    ``requests``/``iterations``: this point's rows only.  ``duration_s``: the point's
    duration (summary.csv's, so throughputs agree with it).  ``started_at``: the point's start
    (epoch s; default the run's).  ``itl``: the point's pooled ITL stats (the runner's
    ``itl_summary``, in the manifest); without them only ``mean_itl_ms`` is written.
    """
    m = measured(requests)
    ok, n_failed, n_unfinished = split_outcomes(requests)
    dur = float(duration_s) if duration_s and duration_s > 0 else float("nan")
    total_in, total_out = int(ok["prompt_tokens"].sum()), int(ok["output_tokens"].sum())
    name = model_name(str(config.get("model", "")))
    res: dict[str, Any] = {
        "date": bench_date(started_at if started_at is not None else manifest.get("started_at")),
        "endpoint_type": "vllm",  # for backward compatibility, as vLLM writes it
        "backend": "vllm",
        "label": config.get("label"),  # vLLM's default: null (--label names a run)
        "model_id": name,
        "tokenizer_id": name,
        "num_prompts": int(len(m)),
        **{k: str(v) for k, v in (config.get("metadata") or {}).items()},  # vLLM: --metadata keys, top level
        **_traffic(config, rate),
        "duration": _f(dur),
        "completed": int(len(ok)),
        "failed": n_failed,
        "unfinished": n_unfinished,
        "never_sent": int(m["sent_s"].isna().sum()),
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": _f(len(ok) / dur),
        "request_goodput": _f(int(meets_slo(requests, slo).sum()) / dur) if slo else None,
        "output_throughput": _f(total_out / dur),
        "total_token_throughput": _f((total_in + total_out) / dur),
    }
    res.update(_latency_arrays(m, ok))  # vLLM 0.32 writes these two without --save-detailed
    if detailed:
        res.update(_detailed(m, ok))
    res.update(_peaks(ok, iterations))
    res["rtfx"] = 0.0  # vLLM's inverse real-time factor is for audio input; 0 for text, as it writes
    res.update(_latency_fields(ok, config.get("percentiles") or BENCH_PERCENTILES, itl))
    res.update(_extras(config, manifest, mode, saturated))
    return res


def _detailed(m: pd.DataFrame, ok: pd.DataFrame) -> dict[str, Any]:
    """vLLM's --save-detailed arrays, one entry per measured request in schedule order.  A failed
    request has 0 output tokens and a TTFT of 0.0, as vLLM records them."""
    m = m.sort_values("request_index")
    good = m.index.isin(ok.index)
    ttft = m["ttft_ms"].to_numpy(float) / 1e3
    return {
        "input_lens": m["prompt_tokens"].astype(int).tolist(),
        "output_lens": [int(n) if g else 0 for n, g in zip(m["output_tokens"], good, strict=True)],
        "ttfts": [float(t) if g and math.isfinite(t) else 0.0 for t, g in zip(ttft, good, strict=True)],
        "start_times": [_f(s) for s in m["sent_s"]],  # seconds since the point's start
        "errors": m["error"].fillna("").astype(str).tolist(),
    }


def _latency_arrays(m: pd.DataFrame, ok: pd.DataFrame) -> dict[str, Any]:
    """vLLM 0.32's per-request E2E (s; 0.0 for a failed request) and the wait between the scheduled
    arrival and the send (s; --max-concurrency slots, or the loop's lag), in schedule order."""
    m = m.sort_values("request_index")
    good = m.index.isin(ok.index)
    return {
        "latencies": [float(e) / 1e3 if g and math.isfinite(e) else 0.0 for e, g in zip(m["e2e_ms"], good, strict=True)],
        "queue_times": [_f(q / 1e3) for q in m["dispatch_lag_ms"]],
    }


def _latency_fields(ok: pd.DataFrame, percentiles=BENCH_PERCENTILES, itl: dict | None = None) -> dict[str, Any]:
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
        for p in percentiles:
            res[f"p{_percentile_key(float(p))}_{name}_ms"] = _f(np.percentile(v, p)) if v.size else 0.0
        if name == "tpot":
            res["mean_itl_ms"] = _mean_itl(ok)
            res.update({f"{k}_itl_ms": _f(v) for k, v in (itl or {}).items()})
    return res


def _extras(config: dict, manifest: dict, mode: str, saturated: bool | None) -> dict[str, Any]:
    """Our keys beyond vLLM's (it writes --metadata ones the same way)."""
    cfg_ds = config.get("dataset", {}) or {}
    return {
        "enable_prefix_caching": arm_caching(config, mode),  # vLLM's serve argument: what `bench sweep plot` groups by
        "prefix_caching": arm_caching(config, mode),
        "prefixstudy_mode": mode,  # the arm
        "prefixstudy_baseline": recorded_baseline(config),  # the arm every other arm is compared with
        "prefixstudy_engine": manifest.get("engine", "vllm"),
        "saturated": None if saturated is None else bool(saturated),
        "prefix_len": cfg_ds.get("prefix_len"),
        "suffix_len": cfg_ds.get("suffix_len"),
        "output_len": cfg_ds.get("output_len"),
        "tensor_parallel_size": (config.get("engine", {}) or {}).get("tensor_parallel_size"),
        "device": manifest.get("device"),
        "vllm_version": manifest.get("vllm_version"),
        "prefixstudy_version": manifest.get("prefixstudy_version"),
    }


def arm_caching(config: dict, mode: str) -> bool:
    """Prefix caching of arm ``mode`` in a recorded config (as data): its ``arms`` entry, else on / off."""
    for a in config.get("arms") or ():
        if a.get("name") == mode:
            return bool(a.get("prefix_caching", True))
    return mode != "off"


def recorded_baseline(config: dict) -> str | None:
    sweep = config.get("sweep") or {}
    modes = sweep.get("modes") or ["on", "off"]
    return sweep.get("baseline") or ("off" if "off" in modes else None)


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


def bench_filename(config: dict, mode: str, rate: float, repeat: int | None = None) -> str:
    """``<study>-<mode>-<rate>qps-<model>.json``; with ``repeat`` (a study of several), ``-r<k>``
    before the model, one file per repeat as `vllm bench serve` writes one per run."""
    model = str(config.get("model", "model")).rstrip("/").split("/")[-1] or "model"
    study = str(config.get("study", "prefixstudy"))
    tag = "" if repeat is None else f"-r{repeat}"
    return f"{study}-{mode}-{rate:g}qps{tag}-{model}.json"


def sweep_path(mode: str, rate: float) -> Path:
    """vLLM's `bench sweep serve` layout: SERVE-<serve params>-BENCH-<bench params>/summary.json.
    The built-in arms are told apart by vLLM's own serve argument; any other arm by its name."""
    rate_text = "inf" if math.isinf(rate) else f"{rate:g}"
    serve = f"enable_prefix_caching={mode == 'on'}" if mode in ("on", "off") else f"arm={mode}"
    return Path(f"SERVE-{serve}-BENCH-request_rate={rate_text}") / "summary.json"


def _manifest_point(manifest: dict, mode: str, rate: float, repeat: int = 0) -> dict:
    for p in manifest.get("points", []):
        if p.get("mode") == mode and np.isclose(float(p.get("rate", math.nan)), rate) \
                and int(p.get("repeat", 0) or 0) == repeat:
            return p
    return {}


def _finished_points(study: StudyResults) -> pd.DataFrame:
    """summary.csv's points that finished, one row per (mode, rate, repeat): a repeat is one run."""
    if not len(study.summary):
        raise UserError(f"{study.path}: summary.csv is missing or empty; no point was summarized")
    p = with_repeat(norm_rate(study.summary))
    p["repeat"] = p["repeat"].fillna(0).astype(int)
    return p[p["status"].fillna("ok").astype(str) != "failed"]


def export_bench(study: StudyResults, out_dir: Path | None = None, points: pd.DataFrame | None = None,
                 slo: dict[str, float] | None = None, *, detailed: bool = False,
                 layout: str = "flat") -> list[Path]:
    """Write one vllm-bench-serve JSON per finished point and repeat into ``out_dir`` (default
    RESULTS/bench): each repeat is a run of its own (its own duration, clock and concurrency), never
    pooled with the others.

    ``points``: mode, rate, duration_s, saturated (and repeat; none: 0); by default summary.csv's
    finished points.  ``slo``: default the run's ``goodput``.  ``layout``: ``flat`` (one file per
    point and repeat, ``-r<k>`` in the name when the study has several) or ``sweep`` (``sweep_path``:
    per mode and rate, the list of its repeats, each with its ``run_number``).
    """
    if layout not in ("flat", "sweep"):
        raise UserError(f"--layout {layout}: use flat or sweep")
    out_dir = Path(out_dir) if out_dir else study.path / "bench"
    slo = slo if slo else (study.config.get("goodput") or None)
    points = _finished_points(study) if points is None else with_repeat(points)
    if points.empty:
        raise UserError(f"{study.path}: no finished points to export")
    requests, iterations = with_repeat(study.requests), with_repeat(study.iterations)
    several = points["repeat"].nunique() > 1 or int(points["repeat"].max()) > 0
    runs: dict[Path, list[dict]] = {}
    for _, p in points.sort_values(["mode", "rate", "repeat"]).iterrows():
        mode, rate, repeat = str(p["mode"]), float(p["rate"]), int(p["repeat"])

        def at(df: pd.DataFrame, mode=mode, rate=rate, repeat=repeat) -> pd.DataFrame:
            return df[(df["mode"] == mode) & np.isclose(df["rate"], rate) & (df["repeat"] == repeat)]

        sat = p.get("saturated")
        entry = _manifest_point(study.manifest, mode, rate, repeat)
        res = point_result(at(requests), at(iterations), mode=mode, rate=rate, duration_s=float(p["duration_s"]),
                           config=study.config, manifest=study.manifest,
                           saturated=None if sat is None or pd.isna(sat) else _as_bool(sat), slo=slo,
                           started_at=entry.get("started_at"), detailed=detailed, itl=entry.get("itl_ms"))
        if layout == "sweep":
            runs.setdefault(out_dir / sweep_path(mode, rate), []).append({**res, "run_number": repeat})
        else:
            runs[out_dir / bench_filename(study.config, mode, rate, repeat if several else None)] = [res]
    for path, items in runs.items():
        write_json(path, items if layout == "sweep" else items[0])
    return list(runs)
