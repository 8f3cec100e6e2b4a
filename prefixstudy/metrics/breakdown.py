"""Per-group and per-turn breakdowns of a study's requests: cached share, TTFT and E2E, every arm
against the baseline (ON vs OFF by default).

Counted requests only (``requests.counted``).  Shares are token-weighted, as summary.csv's hit
rates are: sum of cached tokens over sum of prompt tokens of the requests in the cell.
"""

from __future__ import annotations

import pandas as pd

from prefixstudy.metrics.requests import counted

BY = {"turn": "turn", "group": "group"}


def breakdown(requests: pd.DataFrame, by: str, baseline: str | None = "off") -> pd.DataFrame:
    """One row per mode x rate x ``by`` (``turn`` or ``group``): n, prompt_tokens_mean,
    cached_share (measured), estimated_share (with the engine's blocks), expected_share (infinite
    cache), mean_ttft_ms, mean_e2e_ms; the rows of every arm but ``baseline`` also get e2e_gain and
    ttft_gain, (baseline - arm) / baseline (``results.finish.study_arms`` gives a run's baseline)."""
    ok = counted(requests)
    key = [k for k in ("mode", "rate", "repeat") if k in ok] + [BY[by]]
    rows = []
    for vals, g in ok.groupby(key, sort=True):
        prompt = g["prompt_tokens"].sum()
        est = g["estimated_cached_tokens"] if "estimated_cached_tokens" in g else None
        rows.append({**dict(zip(key, vals, strict=True)), "n": len(g), "prompt_tokens_mean": g["prompt_tokens"].mean(),
                     "cached_share": g["num_cached_tokens"].sum() / prompt,
                     "estimated_share": (est.sum() / prompt) if est is not None and (est >= 0).all() else float("nan"),
                     "expected_share": g["expected_cached_tokens"].sum() / prompt,
                     "mean_ttft_ms": g["ttft_ms"].mean(), "mean_e2e_ms": g["e2e_ms"].mean()})
    df = pd.DataFrame(rows, columns=key + ["n", "prompt_tokens_mean", "cached_share", "estimated_share",
                                           "expected_share", "mean_ttft_ms", "mean_e2e_ms"])
    match = [k for k in key if k != "mode"]
    off = df[df["mode"] == baseline][match + ["mean_ttft_ms", "mean_e2e_ms"]]
    df = df.merge(off, on=match, how="left", suffixes=("", "_off"))
    for x in ("e2e", "ttft"):
        df[f"{x}_gain"] = ((df[f"mean_{x}_ms_off"] - df[f"mean_{x}_ms"]) / df[f"mean_{x}_ms_off"]).where(df["mode"] != baseline)
    return df.drop(columns=["mean_ttft_ms_off", "mean_e2e_ms_off"])


def markdown(df: pd.DataFrame, floatfmt: str = ".3f") -> str:
    """A table for a terminal or report.md (no tabulate needed)."""
    cols = list(df.columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in df.itertuples(index=False):
        cells = [(f"{v:g}" if v.is_integer() else format(v, floatfmt)) if isinstance(v, float) else str(v) for v in r]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
