"""Per-request definitions: which requests count, percentiles, hit rates, SLOs and goodput."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from prefixstudy.errors import UserError
from prefixstudy.schema import KEY  # one point

SLO_KEYS = {"ttft": "ttft_ms", "e2e": "e2e_ms", "tpot": "tpot_ms"}
SLO_ALIASES = {"e2el": "e2e"}  # vLLM's --goodput name


# ----------------------------------------------------------------- selection

def with_repeat(df: pd.DataFrame) -> pd.DataFrame:
    """Rows of runs before repeats (or hand-made frames) are repeat 0."""
    return df if "repeat" in df else df.assign(repeat=0)


def _errors(requests: pd.DataFrame) -> pd.Series:
    return requests["error"].fillna("").astype(str)


def measured(requests: pd.DataFrame) -> pd.DataFrame:
    """Requests that are not warm-up."""
    return requests[~requests["warmup"].astype(bool)]


def is_counted(requests: pd.DataFrame) -> pd.Series:
    """Per request: measured and finished without error.  The one definition of a counted request."""
    return (~requests["warmup"].astype(bool)) & (_errors(requests) == "")


def counted(requests: pd.DataFrame) -> pd.DataFrame:
    """Requests that count for latency statistics: measured and finished without error."""
    return requests[is_counted(requests)]


def split_outcomes(requests: pd.DataFrame) -> tuple[pd.DataFrame, int, int]:
    """Measured rows split into (counted rows, n_failed, n_unfinished)."""
    err = _errors(measured(requests))
    unfinished = err.str.startswith("unfinished")
    return counted(requests), int(((err != "") & ~unfinished).sum()), int(unfinished.sum())


def open_at_end(requests: pd.DataFrame) -> pd.Series:
    """Measured requests still open when their point ended.  Only those sent count: they mean the
    engine fell behind; requests the point cap stopped before their send time only mean the cap
    was shorter than the schedule."""
    m = measured(requests)
    return _errors(m).str.startswith("unfinished") & m["sent_s"].notna()


def duration_s(ok: pd.DataFrame) -> float:
    """Seconds from the first counted send to the last counted completion (NaN for none)."""
    if ok.empty:
        return math.nan
    return float((ok["sent_s"] + ok["e2e_ms"] / 1e3).max() - ok["sent_s"].min())


# ----------------------------------------------------------------- percentiles

def percentile(values, q: float) -> float:
    """The q-th percentile (0..100), linear interpolation; NaN for no finite values."""
    a = np.asarray(values, dtype=float)
    a = a[np.isfinite(a)]
    return float(np.percentile(a, q)) if a.size else math.nan


def percentiles(values, qs: Sequence[float] = (50, 90, 99)) -> dict[float, float]:
    a = np.asarray(values, dtype=float)
    a = a[np.isfinite(a)]
    if not a.size:
        return {q: math.nan for q in qs}
    return dict(zip(qs, (float(v) for v in np.percentile(a, list(qs))), strict=True))


# ----------------------------------------------------------------- prefix cache hits

def hit_rates(requests: pd.DataFrame) -> tuple[float, float]:
    """(measured, expected) share of prompt tokens served from the prefix cache, over counted requests."""
    ok = counted(requests)
    prompt = ok["prompt_tokens"].sum()
    if not prompt:
        return math.nan, math.nan
    return float(ok["num_cached_tokens"].sum() / prompt), float(ok["expected_cached_tokens"].sum() / prompt)


def hit_rate_estimated(requests: pd.DataFrame) -> float:
    """Share of prompt tokens ON should serve with the engine's own KV-cache blocks (the LRU
    estimate of ``cachesim``), over counted requests; NaN for results recorded before it existed."""
    ok = counted(requests)
    prompt = ok["prompt_tokens"].sum()
    if not prompt or "estimated_cached_tokens" not in ok or (ok["estimated_cached_tokens"] < 0).any():
        return math.nan  # -1: recorded before the estimate existed
    return float(ok["estimated_cached_tokens"].sum() / prompt)


def hit_rate_ok(mode: str, measured_rate: float, expected: float, tolerance: float) -> bool:
    """ON must reach the expected rate (within tolerance); OFF must never hit.  ``expected`` is what
    the cache can hold: the capacity-aware estimate where there is one, so eviction is not a failure."""
    if math.isnan(measured_rate):
        return True
    if mode == "off":
        return measured_rate == 0.0
    return measured_rate >= expected - tolerance


# ----------------------------------------------------------------- SLOs and goodput

def _slo_item(text: str, part: str) -> tuple[str, float]:
    m = re.fullmatch(r"([A-Za-z0-9_]+)\s*[=:]\s*([^=:]+)", part)
    if not m:
        raise UserError(f"--slo '{text}': '{part}' is not KEY=MS (e.g. --slo ttft=200,e2e=2000)")
    key = SLO_ALIASES.get(m.group(1).lower(), m.group(1).lower())
    if key not in SLO_KEYS:
        raise UserError(f"--slo '{text}': unknown key '{m.group(1)}'; use {', '.join(SLO_KEYS)}")
    try:
        val = float(m.group(2).strip().removesuffix("ms"))
    except ValueError:
        raise UserError(f"--slo '{text}': '{m.group(2).strip()}' is not a number of milliseconds") from None
    if not (val > 0 and math.isfinite(val)):
        raise UserError(f"--slo '{text}': {key} must be a finite number > 0 ms, got {m.group(2).strip()}")
    return key, val


def parse_slo(text: str | None) -> dict[str, float]:
    """``"ttft=200,e2e=2000"`` -> ``{"ttft": 200.0, "e2e": 2000.0}`` (milliseconds).

    Keys: ttft, e2e (alias e2el), tpot.  Separators ``=`` or ``:``.
    """
    if text is None or not str(text).strip():
        return {}
    out: dict[str, float] = {}
    for part in str(text).split(","):
        key, val = _slo_item(str(text), part.strip())
        if key in out:
            raise UserError(f"--slo '{text}': '{key}' given twice")
        out[key] = val
    return out


def meets_slo(requests: pd.DataFrame, slo: Mapping[str, float]) -> pd.Series:
    """Per request: counted and within every SLO.  A NaN tpot (one output token) counts as 0, as in vLLM."""
    good = is_counted(requests)
    for key, limit in slo.items():
        col = requests[SLO_KEYS[key]].astype(float)
        if key == "tpot":
            col = col.fillna(0.0)
        good &= col <= limit
    return good


def point_durations(requests: pd.DataFrame) -> pd.DataFrame:
    """Per point (mode, rate, repeat, duration_s): ``duration_s`` of its counted requests, as summary.csv has it."""
    rows = [{"mode": m, "rate": r, "repeat": k, "duration_s": duration_s(g)}
            for (m, r, k), g in counted(with_repeat(requests)).groupby(KEY)]
    return pd.DataFrame(rows, columns=KEY + ["duration_s"])


def goodput(requests: pd.DataFrame, slo: Mapping[str, float],
            durations: pd.DataFrame | None = None) -> pd.DataFrame:
    """Requests per second meeting every SLO, over the point's duration.

    ``durations`` (mode, rate, duration_s), e.g. summary.csv; default ``point_durations``.
    Columns: mode, rate, n_good, n_measured, duration_s, goodput_rps.
    """
    m = with_repeat(measured(requests))
    good = meets_slo(m, slo)
    g = pd.DataFrame({"mode": m["mode"], "rate": m["rate"], "repeat": m["repeat"], "good": good.astype(int)})
    g = g.groupby(KEY, sort=True).agg(n_good=("good", "sum"), n_measured=("good", "size")).reset_index()
    dur = with_repeat(durations)[KEY + ["duration_s"]] if durations is not None else point_durations(requests)
    g = g.merge(dur, on=KEY, how="left")
    g["goodput_rps"] = np.where(g["duration_s"] > 0, g["n_good"] / g["duration_s"], np.nan)
    return g
