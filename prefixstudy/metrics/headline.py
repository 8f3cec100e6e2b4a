"""headline.csv: one row per rate, over its repeats, with intervals that hold.  The report's first
screen is this table.

* Latency per mode: mean and p90 E2E over every counted request of every repeat.  The interval
  (``shared.bootstrap.over_repeats``) is Student's t over the repeats' own mean (p90) with two or
  more repeats, so run-to-run spread is inside it; with one repeat, a moving-block bootstrap of
  its consecutive requests.  It holds for the machine the study ran on.
* The gain of the compared arm over the baseline (``arms.compared``: ON over OFF by default),
  (baseline - arm) / baseline of the mean (and of p90), over the requests counted in both,
  paired by request: per repeat for the t interval, the same blocks of request indices in both
  for the one-repeat bootstrap.
* ``arrival_rate``: the mean over repeats of the rate each schedule actually offered; every
  figure's x axis.
* ``*_saturated``: any repeat of that mode was saturated there (``metrics.saturation``); a gain
  where either mode saturated is a bound (``gain_is_bound``): the saturated mode's latency grows
  with how long the point runs.  ``*_saturated_share``: the share of repeats that were; the knee
  goes by the majority, so one repeat's transient does not move it.
* ``*_spread_pct``: (max - min) / mean of the repeats' mean E2E, the run-to-run spread.
* ``*_machines``, ``*_machine_spread_pct``: the machines the repeats ran on, and the spread between
  their means (``metrics.machines``): an interval over repeats on two machines mixes two populations.
* Engine prefill share and decode slowdown per mode (``costmodel.engine_fit``), pooled over the
  repeats' busy steps, with intervals like latency's: t over the repeats' own values, or (one
  repeat) blocks of steps with the coefficients refitted.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from prefixstudy.costmodel import engine_fit
from prefixstudy.shared.bootstrap import Stat, gain, interval, over_repeats, rate_seed
from prefixstudy.metrics.machines import machine_spread
from prefixstudy.metrics.requests import counted, hit_rates
from prefixstudy.metrics.summary import tier_hit_rates

MODES = ("on", "off")

_INTERVAL = "95 % interval (t over repeats, or one repeat's block bootstrap)"
# headline.csv's columns, each with its dtype and meaning (the docs' results reference prints them);
# ``{mode}`` stands for each of the two arms compared (``arms.compared``; MODES by default), ``{arm}``
# for the first of them, the arm compared with the baseline.
HEADLINE_FIELDS: dict[str, tuple[str, str]] = {
    "rate": ("float64", "offered request rate, req/s"),
    "n_repeats": ("int64", "repeats of the rate"),
    "arrival_rate": ("float64", "req/s, mean over repeats of the rate each schedule actually offered"),
    "{mode}_mean_e2e_ms": ("float64", "ms, mean E2E over every counted request of every repeat"),
    "{mode}_p90_e2e_ms": ("float64", "ms, 90th percentile of E2E over the same requests"),
    "{mode}_mean_ttft_ms": ("float64", "ms, mean TTFT"),
    "{mode}_mean_tpot_ms": ("float64", "ms, mean TPOT"),
    "{mode}_mean_e2e_lo": ("float64", f"ms, mean E2E's {_INTERVAL}, lower end"),
    "{mode}_mean_e2e_hi": ("float64", "ms, its upper end"),
    "{mode}_p90_e2e_lo": ("float64", f"ms, p90 E2E's {_INTERVAL}, lower end"),
    "{mode}_p90_e2e_hi": ("float64", "ms, its upper end"),
    "{mode}_spread_pct": ("float64", "%, (max - min) / mean of the repeats' mean E2E; NaN for one repeat"),
    "{mode}_saturated": ("bool", "any repeat of the mode saturated at this rate"),
    "{mode}_saturated_share": ("float64", "share of the repeats that saturated (the knee goes by the majority)"),
    "{mode}_engine_prefill_share": ("float64", "share of busy engine time spent on prompts, the repeats' steps "
                                    "pooled"),
    "{mode}_decode_slowdown": ("float64", "x, how much longer per decode token the steps were than without their "
                               "prefill work"),
    "{mode}_engine_prefill_share_lo": ("float64", f"its {_INTERVAL}, lower end"),
    "{mode}_engine_prefill_share_hi": ("float64", "its upper end"),
    "{mode}_decode_slowdown_lo": ("float64", f"its {_INTERVAL}, lower end"),
    "{mode}_decode_slowdown_hi": ("float64", "its upper end"),
    "n_pairs": ("int64", "requests counted in both arms (ON and OFF by default), paired by (repeat, "
                "request_index)"),
    "gain_mean_e2e": ("float64", "(baseline - arm) / baseline of mean E2E over the pairs, (OFF - ON) / OFF by "
                      "default; 0.3: the arm 30 % faster"),
    "gain_mean_e2e_lo": ("float64", f"its {_INTERVAL}, paired, lower end"),
    "gain_mean_e2e_hi": ("float64", "its upper end"),
    "gain_p90_e2e": ("float64", "(baseline - arm) / baseline of p90 E2E over the pairs"),
    "gain_p90_e2e_lo": ("float64", f"its {_INTERVAL}, paired, lower end"),
    "gain_p90_e2e_hi": ("float64", "its upper end"),
    "gain_is_bound": ("bool", "either arm saturated here: the gain is a bound, not a value"),
    "{arm}_hit_rate": ("float64", "the arm's measured hit rate: cached / prompt tokens of its counted requests"),
    "{arm}_hit_rate_expected": ("float64", "its infinite-cache bound"),
    # The interval holds for the machines the repeats ran on (metrics.machines):
    "{mode}_machines": ("int64", "machines (host, boot, GPU) the mode's repeats ran on at this rate"),
    "{mode}_machine_spread_pct": ("float64", "%, (max - min) / mean of those machines' mean E2E; NaN on one machine"),
}


def headline_columns(arms: tuple[str, str] = MODES) -> list[str]:
    """HEADLINE_FIELDS with ``{mode}`` spelled out for each of ``arms`` (the arm, the baseline)."""
    return list(dict.fromkeys(c.format(mode=m, arm=arms[0]) for c in HEADLINE_FIELDS for m in arms))


def _column(b: np.ndarray, j: int) -> np.ndarray:
    """Column j of resamples (B, n, k) as a contiguous (B, n): each row reduces as ``r[:, j]`` does."""
    return np.ascontiguousarray(b[:, :, j])


def _gains(on: np.ndarray, off: np.ndarray) -> np.ndarray:
    """``gain`` elementwise."""
    ok = (off != 0) & np.isfinite(off) & np.isfinite(on)
    return np.divide(off - on, off, out=np.full(np.shape(off), math.nan), where=ok)


# Mean and p90 of E2E; the paired gain of each (ON in column 0, its baseline in column 1).
MEAN_P90 = Stat(lambda r: np.array([r[:, 0].mean(), np.percentile(r[:, 0], 90)]),
                lambda b: np.stack([_column(b, 0).mean(axis=1), np.percentile(_column(b, 0), 90, axis=1)], axis=1))
PAIRED_GAIN = Stat(
    lambda r: np.array([gain(r[:, 0].mean(), r[:, 1].mean()),
                        gain(np.percentile(r[:, 0], 90), np.percentile(r[:, 1], 90))]),
    lambda b: np.stack([_gains(_column(b, 0).mean(axis=1), _column(b, 1).mean(axis=1)),
                        _gains(np.percentile(_column(b, 0), 90, axis=1), np.percentile(_column(b, 1), 90, axis=1))],
                       axis=1))


def _runs(ok: pd.DataFrame, cols: list[str]) -> list[np.ndarray]:
    return [g.sort_values("request_index")[cols].to_numpy(float) for _, g in ok.groupby("repeat", sort=True)]


def _latency(ok: pd.DataFrame, mode: str, seed) -> dict:
    m = ok[ok["mode"] == mode]
    out = {f"{mode}_mean_e2e_ms": float(m["e2e_ms"].mean()) if len(m) else math.nan,
           f"{mode}_p90_e2e_ms": float(np.percentile(m["e2e_ms"], 90)) if len(m) else math.nan,
           f"{mode}_mean_ttft_ms": float(m["ttft_ms"].mean()) if len(m) else math.nan,
           f"{mode}_mean_tpot_ms": float(m["tpot_ms"].mean()) if len(m) else math.nan}
    lo, hi = (np.full(2, math.nan),) * 2
    if len(m):
        _, lo, hi = over_repeats(_runs(m, ["e2e_ms"]), MEAN_P90, seed=seed, bounds=(0.0, math.inf))
    out[f"{mode}_mean_e2e_lo"], out[f"{mode}_mean_e2e_hi"] = float(lo[0]), float(hi[0])
    out[f"{mode}_p90_e2e_lo"], out[f"{mode}_p90_e2e_hi"] = float(lo[1]), float(hi[1])
    per_repeat = m.groupby("repeat")["e2e_ms"].mean()
    out[f"{mode}_spread_pct"] = (float((per_repeat.max() - per_repeat.min()) / per_repeat.mean() * 100)
                                 if len(per_repeat) > 1 else math.nan)
    return out


def _paired_gain(ok: pd.DataFrame, seed, arm: str, baseline: str) -> dict:
    """The gain of ``arm`` over ``baseline``, (baseline - arm) / baseline, paired by request."""
    on = ok[ok["mode"] == arm][["repeat", "request_index", "e2e_ms"]]
    off = ok[ok["mode"] == baseline][["repeat", "request_index", "e2e_ms"]]
    p = on.merge(off, on=["repeat", "request_index"], suffixes=("_on", "_off"))
    out = {"n_pairs": len(p)}
    if p.empty:
        return {**out, **{k: math.nan for k in ("gain_mean_e2e", "gain_mean_e2e_lo", "gain_mean_e2e_hi",
                                                 "gain_p90_e2e", "gain_p90_e2e_lo", "gain_p90_e2e_hi")}}

    est, lo, hi = over_repeats(_runs(p, ["e2e_ms_on", "e2e_ms_off"]), PAIRED_GAIN, seed=seed,
                               bounds=(-math.inf, 1.0))
    out["gain_mean_e2e"], out["gain_p90_e2e"] = float(est[0]), float(est[1])
    out["gain_mean_e2e_lo"], out["gain_mean_e2e_hi"] = float(lo[0]), float(hi[0])
    out["gain_p90_e2e_lo"], out["gain_p90_e2e_hi"] = float(lo[1]), float(hi[1])
    return out


def _engine(busy: pd.DataFrame, fit: engine_fit.StepFit | None, mode: str, seed) -> dict:
    """Engine prefill share and decode slowdown of one mode at one rate, over its repeats."""
    keys = [f"{mode}_engine_prefill_share", f"{mode}_decode_slowdown"]
    out = {k: math.nan for k in keys} | {f"{k}_{e}": math.nan for k in keys for e in ("lo", "hi")}
    if fit is None or busy.empty:
        return out
    b = busy[busy["mode"] == mode]
    if b.empty:
        return out
    runs = [engine_fit.step_arrays(g) for _, g in b.groupby("repeat", sort=True)]
    out[keys[0]], out[keys[1]] = engine_fit.stats(np.concatenate(runs), fit.coef)
    if len(runs) > 1:
        _, lo, hi = over_repeats(runs, lambda a: np.array(engine_fit.stats(a, fit.coef)),
                                 bounds=(np.array([0.0, 1.0]), np.array([1.0, math.inf])))  # share, slowdown
        (out[f"{keys[0]}_lo"], out[f"{keys[1]}_lo"]), (out[f"{keys[0]}_hi"], out[f"{keys[1]}_hi"]) = lo, hi
        return out
    reps = engine_fit.replicates(runs, fit, seed)
    (out[f"{keys[0]}_lo"], out[f"{keys[0]}_hi"]), (out[f"{keys[1]}_lo"], out[f"{keys[1]}_hi"]) = \
        interval(reps[:, 0]), interval(reps[:, 1])
    return out


def headline(requests: pd.DataFrame, summary: pd.DataFrame, iterations: pd.DataFrame | None = None,
             fit: engine_fit.StepFit | None = None, arms: tuple[str, str] = MODES) -> pd.DataFrame:
    """One row per rate (see the module docstring), ``arms[0]`` against the baseline ``arms[1]``.
    Pure: frames in, frame out, seeded by rate."""
    arm, baseline = arms
    ok = counted(requests)
    busy = engine_fit.busy_steps(iterations) if iterations is not None and len(iterations) else None
    rows = []
    for rate in sorted(summary["rate"].unique()):
        seed = np.random.SeedSequence([rate_seed(rate)])
        child = seed.spawn(4)
        s = summary[summary["rate"] == rate]
        at = ok[ok["rate"] == rate]
        row = {"rate": float(rate), "n_repeats": int(s["repeat"].nunique()),
               "arrival_rate": float(s["arrival_rate"].mean()) if "arrival_rate" in s else math.nan}
        for i, mode in enumerate(arms):
            row |= _latency(at, mode, child[i])
            sat = s[s["mode"] == mode]["saturated"].astype(bool)
            row[f"{mode}_saturated"] = bool(sat.any()) if len(sat) else False
            row[f"{mode}_saturated_share"] = float(sat.mean()) if len(sat) else math.nan
            eng = busy[busy["rate"] == rate] if busy is not None else pd.DataFrame()
            row |= _engine(eng, fit, mode, child[2 + i])
        row |= _paired_gain(at, seed, arm, baseline)
        row["gain_is_bound"] = bool(row[f"{arm}_saturated"] or row[f"{baseline}_saturated"])
        row[f"{arm}_hit_rate"], row[f"{arm}_hit_rate_expected"] = hit_rates(at[at["mode"] == arm]) \
            if (at["mode"] == arm).any() else (math.nan, math.nan)
        row |= machine_spread(at, s, arms)
        rows.append(row)
    return pd.DataFrame(rows)


# arms.csv's columns in order, each with its dtype and meaning.
ARMS_FIELDS: dict[str, tuple[str, str]] = {
    "rate": ("float64", "offered request rate, req/s"),
    "arm": ("str", "the arm compared"),
    "baseline": ("str", "the arm it is compared with (`sweep.baseline`)"),
    "n_repeats": ("int64", "repeats of the rate"),
    "arrival_rate": ("float64", "req/s, mean over repeats of the rate each schedule actually offered"),
    "mean_e2e_ms": ("float64", "ms, the arm's mean E2E over its counted requests"),
    "mean_e2e_lo": ("float64", f"ms, its {_INTERVAL}, lower end"),
    "mean_e2e_hi": ("float64", "ms, its upper end"),
    "p90_e2e_ms": ("float64", "ms, the arm's 90th percentile of E2E"),
    "p90_e2e_lo": ("float64", f"ms, its {_INTERVAL}, lower end"),
    "p90_e2e_hi": ("float64", "ms, its upper end"),
    "baseline_mean_e2e_ms": ("float64", "ms, the baseline's mean E2E"),
    "baseline_p90_e2e_ms": ("float64", "ms, the baseline's 90th percentile of E2E"),
    "n_pairs": ("int64", "requests counted in both, paired by (repeat, request_index)"),
    "gain_mean_e2e": ("float64", "(baseline - arm) / baseline of mean E2E over the pairs"),
    "gain_mean_e2e_lo": ("float64", f"its {_INTERVAL}, paired, lower end"),
    "gain_mean_e2e_hi": ("float64", "its upper end"),
    "gain_p90_e2e": ("float64", "(baseline - arm) / baseline of p90 E2E over the pairs"),
    "gain_p90_e2e_lo": ("float64", f"its {_INTERVAL}, paired, lower end"),
    "gain_p90_e2e_hi": ("float64", "its upper end"),
    "saturated": ("bool", "any repeat of the arm saturated at this rate"),
    "baseline_saturated": ("bool", "any repeat of the baseline saturated at this rate"),
    "gain_is_bound": ("bool", "either saturated: the gain is a bound"),
    "hit_rate": ("float64", "the arm's measured hit rate: cached / prompt tokens of its counted requests"),
    "hit_rate_expected": ("float64", "its infinite-cache bound"),
    # The engine's own count by tier (metrics.summary.tier_hit_rates); NaN where it does not say:
    "hit_rate_gpu": ("float64", "share of prompt tokens the engine served from its GPU prefix cache"),
    "hit_rate_cpu": ("float64", "share of prompt tokens the engine served from its CPU tier"),
}
ARMS_COLUMNS = list(ARMS_FIELDS)


def versus_baseline(requests: pd.DataFrame, summary: pd.DataFrame, arms: list[str], baseline: str) -> pd.DataFrame:
    """arms.csv: one row per rate x arm other than ``baseline``: the arm's E2E with intervals (as
    headline.csv's per mode) and its gain over the baseline, paired by request as headline.csv's ON
    over OFF.  Every arm replayed the same schedule, so request i of any two arms saw the same
    arrivals.  Seeded per (rate, arm's position), so adding an arm at the end moves no other row."""
    ok = counted(requests)
    rows = []
    for rate in sorted(summary["rate"].unique()):
        s, at = summary[summary["rate"] == rate], ok[ok["rate"] == rate]
        base_sat = s[s["mode"] == baseline]["saturated"].astype(bool)
        for i, arm in enumerate(a for a in arms if a != baseline):
            if not (s["mode"] == arm).any():
                continue
            seed = np.random.SeedSequence([rate_seed(rate), 1 + i])
            lat = _latency(at, arm, seed.spawn(1)[0])
            b = at.loc[at["mode"] == baseline, "e2e_ms"].to_numpy(float)
            sat = s[s["mode"] == arm]["saturated"].astype(bool)
            g = _paired_gain(at, seed, arm, baseline)
            m = at[at["mode"] == arm]
            hit, hit_exp = hit_rates(m) if len(m) else (math.nan, math.nan)
            arm_reqs = requests[(requests["rate"] == rate) & (requests["mode"] == arm)]
            hit_gpu, hit_cpu = tier_hit_rates(s[s["mode"] == arm], arm_reqs)
            rows.append({
                "rate": float(rate), "arm": arm, "baseline": baseline, "n_repeats": int(s["repeat"].nunique()),
                "arrival_rate": float(s["arrival_rate"].mean()) if "arrival_rate" in s else math.nan,
                **{k: lat[f"{arm}_{k}"] for k in ("mean_e2e_ms", "mean_e2e_lo", "mean_e2e_hi",
                                                   "p90_e2e_ms", "p90_e2e_lo", "p90_e2e_hi")},
                "baseline_mean_e2e_ms": float(b.mean()) if b.size else math.nan,
                "baseline_p90_e2e_ms": float(np.percentile(b, 90)) if b.size else math.nan, **g,
                "saturated": bool(sat.any()), "baseline_saturated": bool(base_sat.any()),
                "gain_is_bound": bool(sat.any() or base_sat.any()), "hit_rate": hit, "hit_rate_expected": hit_exp,
                "hit_rate_gpu": hit_gpu, "hit_rate_cpu": hit_cpu})
    return pd.DataFrame(rows, columns=ARMS_COLUMNS)


def tiers_versus_cache(requests: pd.DataFrame, summary: pd.DataFrame, arms: pd.DataFrame,
                       cache: str = "on") -> pd.DataFrame:
    """Every arm whose engine counted cached tokens from a CPU tier (arms.csv's ``hit_rate_cpu``)
    against ``cache``, the same prefix cache without the tier (caching ON): arms.csv's columns,
    paired by request.  What the tier adds, apart from what the GPU cache already gives; empty
    where no arm has a tier or ``cache`` did not run."""
    if not len(arms) or "hit_rate_cpu" not in arms:
        return pd.DataFrame(columns=ARMS_COLUMNS)
    tiered = [a for a, g in arms.groupby("arm", sort=False)
              if a != cache and np.isfinite(g["hit_rate_cpu"].to_numpy(float)).any()]
    if not tiered or not (summary["mode"] == cache).any():
        return pd.DataFrame(columns=ARMS_COLUMNS)
    return versus_baseline(requests, summary, [cache, *tiered], cache)


def _ran(head: pd.DataFrame, mode: str) -> pd.DataFrame:
    """The rows of ``head`` at which ``mode`` ran (a rate only the other mode ran says nothing about
    this one), in arrival-rate order."""
    h = head.sort_values("arrival_rate")
    ran = pd.Series(True, index=h.index)
    if f"{mode}_saturated_share" in h:
        ran &= h[f"{mode}_saturated_share"].notna()
    if f"{mode}_mean_e2e_ms" in h:
        ran &= h[f"{mode}_mean_e2e_ms"].notna()
    return h[ran]


def knee(head: pd.DataFrame, mode: str) -> tuple[float, float, float]:
    """(knee, lo, hi) in actual arrival rate: between the last rate where most repeats of ``mode``
    kept up (every lower rate too) and the next, where most saturated; the knee is their midpoint.
    Rates the mode did not run are passed over.  (nan, nan, nan) if the lowest rate saturated;
    (nan, last, nan) if none did (the knee is beyond)."""
    h = _ran(head, mode)
    share = h[f"{mode}_saturated_share"] if f"{mode}_saturated_share" in h else h[f"{mode}_saturated"].astype(float)
    last = math.nan
    for x, s in zip(h["arrival_rate"], share, strict=True):
        if s > 0.5:
            return ((last + x) / 2 if math.isfinite(last) else math.nan, last, x)
        last = float(x)
    return (math.nan, last, math.nan)


def _counts(h: pd.DataFrame, mode: str) -> list[tuple[float, int, int]]:
    """(arrival rate, repeats saturated, repeats) of each rate ``mode`` ran, in rate order."""
    share = h[f"{mode}_saturated_share"] if f"{mode}_saturated_share" in h else h[f"{mode}_saturated"].astype(float)
    n = h["n_repeats"] if "n_repeats" in h else pd.Series(1, index=h.index)
    return [(float(x), int(round(float(s) * int(k))), int(k))
            for x, s, k in zip(h["arrival_rate"], share, n, strict=True)]


def knee_bracket(head: pd.DataFrame, mode: str) -> dict:
    """A mode's knee as an arrival-rate bracket with its evidence (the rule of ``knee``): ``lo``
    the last rate where most repeats kept up (every lower rate too) and ``hi`` the next, where most
    saturated, each with ``*_saturated`` of ``*_repeats``; ``mixed``: the rates up to ``hi`` whose
    repeats disagreed, as (rate, saturated, repeats).  ``hi`` is NaN when no rate was mostly
    saturated (the knee is beyond ``lo``); ``lo`` is NaN when the lowest rate already was.
    ``text``: one sentence, e.g. "OFF's knee lies between 16.2 req/s (kept up in 2 of 2 repeats)
    and 19.9 req/s (saturated in 2 of 2)"."""
    counts = _counts(_ran(head, mode), mode)
    out = {"mode": mode, "lo": math.nan, "lo_saturated": 0, "lo_repeats": 0, "hi": math.nan, "hi_saturated": 0,
           "hi_repeats": 0, "mixed": []}
    for x, k, n in counts:
        if 0 < k < n:
            out["mixed"].append((x, k, n))
        if k / n > 0.5:
            out.update(hi=x, hi_saturated=k, hi_repeats=n)
            break
        out.update(lo=x, lo_saturated=k, lo_repeats=n)
    out["text"] = _bracket_text(out)
    return out


def _bracket_text(b: dict) -> str:
    name = b["mode"].upper() if b["mode"] in MODES else b["mode"]

    def kept(x, k, n):
        return f"{x:.1f} req/s (kept up in {n - k} of {n} repeat{'s' if n > 1 else ''})"

    def sat(x, k, n):
        return f"{x:.1f} req/s (saturated in {k} of {n})"

    if math.isfinite(b["lo"]) and math.isfinite(b["hi"]):
        text = (f"{name}'s knee lies between {kept(b['lo'], b['lo_saturated'], b['lo_repeats'])} and "
                f"{sat(b['hi'], b['hi_saturated'], b['hi_repeats'])}")
    elif math.isfinite(b["lo"]):
        if b["mixed"]:
            text = f"{name} kept up in most repeats of every rate it ran, up to " \
                   f"{kept(b['lo'], b['lo_saturated'], b['lo_repeats'])}: its knee is beyond"
        else:
            text = f"{name} kept up in every repeat of every rate it ran, up to {b['lo']:.1f} req/s: its knee is beyond"
    elif math.isfinite(b["hi"]):
        text = f"{name} saturated already at its lowest rate, {sat(b['hi'], b['hi_saturated'], b['hi_repeats'])}"
    else:
        return f"{name} ran no rate"
    others = [m for m in b["mixed"] if m[0] not in (b["lo"], b["hi"])]
    if others:
        text += "; repeats disagreed at " + ", ".join(f"{x:.1f} req/s ({k} of {n} saturated)" for x, k, n in others)
    return text


def rate_at_threshold(head: pd.DataFrame, mode: str, threshold_ms: float, metric: str = "p90_e2e") -> tuple:
    """(rate, lo, hi): the arrival rate at which ``mode``'s ``metric`` crosses ``threshold_ms``,
    linearly interpolated between the two rates around the crossing; lo/hi from the interval's
    upper/lower curve.  A rate where most repeats saturated counts as over any threshold (as for
    the knee); rates the mode did not run are passed over.  NaN where the lowest rate is already
    over; the highest rate (a bound) where none is."""
    h = _ran(head, mode)
    x = h["arrival_rate"].to_numpy(float)
    share = h[f"{mode}_saturated_share"] if f"{mode}_saturated_share" in h else h[f"{mode}_saturated"].astype(float)
    sat = share.to_numpy(float) > 0.5

    def cross(col: str) -> float:
        y = np.where(sat, np.inf, h[col].to_numpy(float))
        for i in range(len(x)):
            if not y[i] <= threshold_ms:
                if i == 0:
                    return math.nan
                if not np.isfinite(y[i]):
                    return float(x[i - 1])  # saturated next: no line to interpolate on
                return float(x[i - 1] + (threshold_ms - y[i - 1]) * (x[i] - x[i - 1]) / (y[i] - y[i - 1]))
        return float(x[-1]) if len(x) else math.nan

    base = f"{mode}_{metric}"
    return cross(f"{base}_ms"), cross(f"{base}_hi"), cross(f"{base}_lo")
