"""Stage: report (words and tables).  ReportData in, headline sentences and display tables out."""

from __future__ import annotations

import math

import pandas as pd

from prefixstudy.metrics.headline import knee_bracket
from prefixstudy.metrics.saturation import COMPLETION_MIN, FULL_LEVEL, FULL_SHARE, MIN_TREND_WINDOW_S, WAIT_SHARE
from prefixstudy.config.arms import arm_label
from prefixstudy.report import saturation_codes as sat_codes
from prefixstudy.report.data import ReportData, arm_text
from prefixstudy.report.render import SAT_MARK
from prefixstudy.results import StudyResults
from prefixstudy.schema import MODES

ESTIMATOR_TEXT = (
    "Engine-level prefill share: every engine step is timed inside vLLM's engine core (a scheduler "
    "subclass stamps each step's start and end; idle time is never inside a step). We fit "
    "step_ms = a + b·prefill_tokens + e·prefill_requests + c·decode_tokens + k·context_tokens by "
    "non-negative least squares over the study's busy steps, both modes pooled (caching changes how "
    "many prompt tokens a step computes, not what one costs). e is a prefill's cost beyond its tokens "
    "(a cached prefill still attends to its whole context). k, attention over the context, is kept "
    "only where it removes at least 1 % of the squared error (else 0). The same fit prices the "
    "simulator's steps. Per point the share is Σ(b·prefill_tokens + e·prefill_requests "
    "+ k·prefill context) / Σstep_ms, "
    "and the decode slowdown is Σ(decode_tokens·step_ms) / Σ(decode_tokens·(step_ms − prefill cost)): "
    "how much longer steps were, per decode token, for the prefill work they carried. Intervals: "
    "95 % moving-block bootstrap of the steps (repeats resampled too), coefficients refitted on each "
    "resample. Runs timed before this at the frontend keep only steps that follow a busy record."
)
SATURATION_TEXT = (
    f"A point is saturated when, within its arrival window, a sent request was left unfinished, fewer "
    f"than {COMPLETION_MIN:.0%} of the arrivals completed within the window shifted by the early "
    f"latency, the engine ran full (the requests in the system at {FULL_LEVEL:.0%} or more of its "
    f"admission limit, max_num_seqs x replicas, through {FULL_SHARE:.0%} of the window's last half), or "
    f"requests waited for admission in {WAIT_SHARE:.0%} of the engine's steps there. A trend test on the "
    f"requests in the system also decides on windows of at least {MIN_TREND_WINDOW_S:.0f} s of arrivals, and "
    f"over HTTP without the server's limit. The error rates are "
    f"measured on vLLM's scheduler in docs/saturation.md. A saturated point's latency grows with how "
    f"long it runs: it is a bound, and so is a gain measured there. A mode's knee "
    f"(metrics.headline.knee_bracket) lies between the last rate where most repeats kept up (and every "
    f"lower rate too) and the next rate, where most repeats saturated, in actual arrival rate; a rate a "
    f"mode never ran ends the search, and a rate whose repeats disagree is named with its share saturated."
)
INTERVAL_TEXT = (
    "Intervals are 95 %. With two or more repeats a rate's interval is Student's t over the repeats' own "
    "values (shared.bootstrap.over_repeats; coverage tested by simulation at 2, 3 and 5 repeats), so "
    "run-to-run spread is inside it; with one repeat it is a moving-block bootstrap of consecutive "
    "requests, which cannot show that spread. An interval holds for the machine the study ran on: "
    "another machine of the same kind can fall outside it."
)
COUNTED_TEXT = "Counted requests: warmup == False and error == \"\". Percentiles: linear interpolation."


# ----------------------------------------------------------------- formatting

def bound_mark(arm_saturated: bool, baseline_saturated: bool) -> str:
    """What a gain (baseline - arm) / baseline measured at a saturated point is: ≥ where only the
    baseline saturated (its mean would only grow), ≤ where only the arm did, ⚠ where both did (it
    bounds nothing); "" where neither did."""
    if arm_saturated and baseline_saturated:
        return "⚠ "
    return "≤ " if arm_saturated else "≥ " if baseline_saturated else ""


def fmt(v, spec: str = ".1f") -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "–"
    try:
        return format(v, spec)
    except (TypeError, ValueError):
        return str(v)


def rate_str(r: float) -> str:
    """A rate as a reader wants it: 16, 0.5, 12.71 (two decimals at most)."""
    return f"{r:.2f}".rstrip("0").rstrip(".")


def rate_text(r: float) -> str:
    return rate_str(r) if math.isfinite(r) else "no measured rate"


def rates_list(rates) -> str:
    return ", ".join(rate_str(r) for r in rates) + " req/s"


def pct(v) -> str:
    return fmt(100 * v, ".0f") + " %" if v is not None and math.isfinite(v) else "–"


def mark(rate: float, sat: bool) -> str:
    return f"{SAT_MARK} {rate_str(rate)}" if sat else rate_str(rate)


def fmt_df(df: pd.DataFrame) -> pd.DataFrame:
    """Every float column as 4 significant digits."""
    out = df.copy()
    for c in out.columns:
        if pd.api.types.is_float_dtype(out[c]):
            out[c] = out[c].map(lambda v: fmt(v, ".4g"))
    return out


def scheduling_text(points: list[dict]) -> str:
    """Which vLLM engine the points measured, as their engines resolved it ("" where none says):
    the default one, which schedules step N+1 while step N runs, or one step at a time."""
    arms: dict[bool, set[str]] = {}
    for p in points:
        if p.get("async_scheduling") is not None:
            arms.setdefault(bool(p["async_scheduling"]), set()).add(str(p.get("mode")))
    if len(arms) == 2:
        def named(modes):
            return ("arm " if len(modes) == 1 else "arms ") + ", ".join(f"`{m}`" for m in sorted(modes))
        return f"; vLLM's async scheduling on in {named(arms[True])}, off in {named(arms[False])}"
    if True in arms:
        return "; vLLM's async scheduling on (its default on GPUs: step N+1 is scheduled while step N runs)"
    return "; vLLM's async scheduling off (one engine step at a time)" if arms else ""


def meta_line(s: StudyResults) -> str:
    m, c = s.manifest, s.config
    ds = c.get("dataset") or {}
    return (f"Run {s.path.name}: device {m.get('device', '?')}, vLLM {m.get('vllm_version') or 'n/a'}, "
            f"torch {m.get('torch_version') or 'n/a'}, prefixstudy {m.get('prefixstudy_version', '?')}; "
            f"model {c.get('model', '?')}, TP={(c.get('engine') or {}).get('tensor_parallel_size', 1)}"
            f"{scheduling_text(m.get('points') or [])}; "
            f"dataset prefix {ds.get('prefix_len', '?')} + suffix {ds.get('suffix_len', '?')} tokens, "
            f"output {ds.get('output_len', '?')} tokens, {ds.get('groups', '?')} prefix group(s); "
            f"status {m.get('status') or '?'}; {m.get('started_at') or 'start not recorded'} – "
            f"{m.get('ended_at') or 'end not recorded'}.")


# ----------------------------------------------------------------- headline

def _cap(text: str) -> str:
    return text[:1].upper() + text[1:]


def _saturation_sentence(d: ReportData, mode: str) -> str | None:
    p = d.done[d.done["mode"] == mode]
    if p.empty:
        return None
    sat = p[p["saturated"]]
    bracket = knee_bracket(d.head, mode)["text"] if len(d.head) else "no headline.csv to place the knee"
    if sat.empty:
        return f"{_cap(arm_text(mode))}: no point saturated (up to {p['rate'].max():.2f} req/s); {bracket}."
    return (f"{_cap(arm_text(mode))}: saturated at {', '.join(f'{r:.2f}' for r in sat['rate'])} req/s "
            f"(the Saturation section says why); {bracket}.")


def headline_paragraphs(d: ReportData) -> list[str]:
    h = d.headline
    y, sus = h["threshold_ms"], h["sustains"]
    out = []
    if math.isfinite(y):
        top = float(d.head["arrival_rate"].max()) if len(d.head) else math.nan

        def at(m):
            r, lo, hi = sus[m]
            if not math.isfinite(r):
                return "no rate"
            if r == top:  # the highest rate measured still met it: a lower bound
                return f"≥ {r:.1f} req/s (the highest rate measured)"
            return f"{r:.1f} req/s [{fmt(lo, '.1f')}, {fmt(hi, '.1f')}]"
        (a, b), named = d.arms, d.arms == MODES
        who = f"caching ON sustains {at(a)} and OFF {at(b)}" if named else \
            f"{arm_label(a)} sustains {at(a)} and its baseline {arm_label(b)} {at(b)}"
        out.append(f"At p90 E2E ≤ {y:.1f} ms {who} (actual arrival "
                   f"rates, interpolated where p90 crosses the threshold; the interval from p90's 95 % interval; "
                   f"a saturated rate counts as over). Threshold: {h['threshold_source']}.")
    out += [s for s in (_saturation_sentence(d, m) for m in d.arms) if s]
    failed = d.manifest_points[d.manifest_points["status"].isin(["failed", "interrupted"])]
    if len(failed):
        out.append("Points that did not finish: " + "; ".join(
            f"{r['mode']} @ {rate_str(r['rate'])} req/s {r['status']}" + (f" ({r['error']})" if r["error"] else "")
            for _, r in failed.iterrows()) + ".")
    return out


# ----------------------------------------------------------------- tables

def points_table(d: ReportData) -> pd.DataFrame:
    p = d.points
    t = pd.DataFrame({
        "mode": p["mode"].str.upper(),
        "rate (req/s)": [mark(r, s) for r, s in zip(p["rate"], p["saturated"], strict=True)],
        "status": p["status"],
        "ok": p["n_ok"].map(lambda v: fmt(v, ".0f")),
        "achieved (req/s)": p["achieved_rate"].map(lambda v: fmt(v, ".2f")),
        "mean E2E (ms)": p["mean_e2e_ms"].map(fmt),
        "p90 E2E (ms)": p["p90_e2e_ms"].map(fmt),
        "p99 E2E (ms)": p["p99_e2e_ms"].map(fmt),
        "mean TTFT (ms)": p["mean_ttft_ms"].map(fmt),
        "p90 TTFT (ms)": p["p90_ttft_ms"].map(fmt),
        "p99 TTFT (ms)": p["p99_ttft_ms"].map(fmt),
        "queue / prefill / decode (ms)": [f"{fmt(a)} / {fmt(b)} / {fmt(c)}" for a, b, c in
                                          zip(p["mean_queue_ms"], p["mean_prefill_ms"], p["mean_decode_ms"], strict=True)],
    })
    if "goodput_rps" in p:
        t["goodput (req/s)"] = p["goodput_rps"].map(lambda v: fmt(v, ".2f"))
    t["saturated"] = [sat_codes.cell(d.study.summary, (m,), r, label=False)
                      for m, r in zip(p["mode"], p["nominal_rate"], strict=True)]
    return t


def prefill_table(d: ReportData) -> pd.DataFrame:
    p = d.points
    return pd.DataFrame({
        "mode": p["mode"].str.upper(),
        "rate (req/s)": [mark(r, s) for r, s in zip(p["rate"], p["saturated"], strict=True)],
        "request level: mean prefill / mean E2E": p["prefill_share"].map(pct),
        "engine level: Σ(prefill cost) / Σstep": p["prefill_share_engine"].map(pct),
        "decode slowdown": p["decode_slowdown"].map(lambda v: fmt(v, ".2f") + "×" if v == v else "–"),  # noqa: PLR0124 - NaN test
    })


def fit_table(d: ReportData) -> pd.DataFrame:
    f = d.fit
    if f.empty:
        return f
    return pd.DataFrame({
        "a (ms/step)": f["a_ms"].map(lambda v: fmt(v, ".3f")),
        "b (ms/prefill token)": f["b_ms_per_prefill_token"].map(lambda v: fmt(v, ".5f")),
        "e (ms/prefill request)": f["e_ms_per_prefill_req"].map(lambda v: fmt(v, ".3f")),
        "c (ms/decode token)": f["c_ms_per_decode_token"].map(lambda v: fmt(v, ".4f")),
        "k (ms/context token)": (f["k_ms_per_context_token"] if "k_ms_per_context_token" in f
                                 else pd.Series([math.nan] * len(f))).map(lambda v: fmt(v, ".6f")),
        "R²": f["r2"].map(lambda v: fmt(v, ".3f")),
        "RMSE (ms)": f["rmse_ms"].map(lambda v: fmt(v, ".2f")),
        "busy steps": f["n"].astype(str),
    })


FIT_KIND_TEXT = ("The pooled fit's R² is over every busy step, where OFF's long prefill steps dominate the "
                 "spread. Below, each arm's steps that carry prompt tokens (mixed) and its decode-only steps, "
                 "each against the same pooled fit: a low R² on a short-step kind means the fit prices those "
                 "steps' variation poorly, however high the pooled R² is.")


def fit_kind_table(d: ReportData) -> pd.DataFrame:
    """The pooled fit on each arm's mixed and decode-only steps (``engine_fit.fit_by_kind``, recorded by
    ``results.finish``); empty for a run finished before it was recorded."""
    kinds = d.fit["by_kind"].iloc[0] if not d.fit.empty and "by_kind" in d.fit else None
    if not isinstance(kinds, list) or not kinds:
        return pd.DataFrame()
    return pd.DataFrame([{"mode": k["mode"].upper(), "steps": k["kind"], "n": f"{k['n']:,}",
                          "R²": fmt(k["r2"], ".3f") if k["r2"] is not None else "–",
                          "RMSE (ms)": fmt(k["rmse_ms"], ".2f"), "mean step (ms)": fmt(k["mean_ms"], ".2f")}
                         for k in kinds])


def _gain_row(d: ReportData, rate: float, saturated: bool) -> dict:
    g = d.gains
    row = {"rate (req/s)": mark(rate, saturated)}
    for metric, name in (("e2e_ms", "E2E"), ("ttft_ms", "TTFT")):
        r = g[(g["rate"] == rate) & (g["metric"] == metric)]
        if len(r):
            r = r.iloc[0]
            row[f"{name} gain [95% CI]"] = f"{pct(r['gain'])} [{pct(r['ci_lo'])}, {pct(r['ci_hi'])}]"
    pr = d.paired[d.paired["rate"] == rate]
    if len(pr):
        pr = pr.iloc[0]
        row["pairs"] = str(int(pr["n_pairs"]))
        row["paired ΔE2E mean / median (ms)"] = f"{fmt(pr['mean_delta'])} / {fmt(pr['median_delta'])}"
        row["paired ΔTTFT mean (ms)"] = fmt(pr["mean_delta_ttft"])
        row[f"{arm_label(d.arms[0])} faster"] = pct(pr["on_faster_share"])
    return row


def gain_table(d: ReportData) -> pd.DataFrame:
    sat_rates = set(d.points.loc[d.points["saturated"], "rate"])
    return pd.DataFrame([_gain_row(d, rate, rate in sat_rates) for rate in sorted(d.gains["rate"].unique())])


def all_points_table(d: ReportData) -> pd.DataFrame:
    mp = d.manifest_points
    # Saturation is judged per repeat: one saturated repeat marks that repeat only.
    sat = d.repeat_saturated
    return pd.DataFrame({
        "point": [f"{m.upper()} @ {n:g} req/s" + (f" repeat {int(k)}" if mp["repeat"].max() > 0 else "")
                  + (f" (actual {r:.2f})" if r != n else "")
                  for m, n, k, r in zip(mp["mode"], mp["nominal_rate"], mp["repeat"], mp["rate"], strict=True)],
        "status": mp["status"],
        "saturated": ["yes" if sat.get((m, float(n), int(k)), False) else "no"
                      for m, n, k in zip(mp["mode"], mp["nominal_rate"], mp["repeat"], strict=True)],
        "error": mp["error"],
    })


def step_check_lines(checks: dict | None) -> list[str]:
    """The step-timing invariants (metrics.step_checks) in words, one line per check and mode."""
    if not checks:
        return ["No engine-stamped steps: the step-timing checks do not apply."]
    verdict = {True: "passes", False: "FAILS", None: "cannot be judged"}
    out = []
    for mode, c in checks.get("pairwise", {}).items():
        out.append(f"{mode.upper()}, a step with prompt tokens not shorter than the decode-only step right before it: "
                   f"{verdict[c['ok']]}: {c['shorter']} of {c['n']} pairs shorter beyond noise (at most "
                   f"{c['max_share']:.0%} may be).")
    for mode, c in checks.get("pairwise_host", {}).items():
        out.append(f"{mode.upper()}, the same on the host stamps of these GPU-timed steps (not judged): "
                   f"{c['shorter']} of {c['n']} pairs shorter.")
    for mode, c in checks["prefill_not_faster"].items():
        if not c["n"]:
            out.append(f"{mode.upper()}: no step with prompt tokens has a same-batch decode-only reference.")
            continue
        out.append(f"{mode.upper()}, steps with prompt tokens not faster than decode-only steps of the same batch: "
                   f"{verdict[c['ok']]}: {c['faster_share']:.1%} of {c['n']} were faster than their batch's median "
                   f"decode-only step (bound {c['bound']:.1%}); medians {c['prefill_median_ms']:.2f} vs "
                   f"{c['decode_median_ms']:.2f} ms.")
    w = checks["window_agreement"]
    if w["ok"] is None:
        out.append(f"Window-sum fit: only {w['n_windows']} windows of {w['window']} fitted steps; not judged.")
    else:
        for mode, c in w["modes"].items():
            out.append(f"{mode.upper()}, fit on sums of {w['window']} consecutive steps vs the per-step fit: "
                       f"{verdict[c['ok']]}: they attribute {c['max_diff']:.1%} of busy time differently "
                       f"(prefill {c['prefill_diff']:.1%}, decode {c['decode_diff']:.1%}, total "
                       f"{c['total_diff']:.1%}; tolerance {w['tolerance']:.0%}).")
        out.append(f"On the window sums the per-step fit's RMSE is {w['rmse_ms_step_fit']:.1f} ms, the window "
                   f"fit's {w['rmse_ms_window_fit']:.1f} ms (R² {w['r2']:.3f}).")
    for mode, c in checks.get("busy_time", {}).items():
        if c["at"]:
            out.append(f"{mode.upper()}, step times within each point's wall time: {verdict[c['ok']]}: at most "
                       f"{c['worst']:.1%} of it ({c['at']['rate']:g} req/s, repeat {c['at']['repeat']}).")
    if checks["ok"] is False:
        out.append("A failed check means the step records misattribute time between steps: read the engine "
                   "prefill share, the decode slowdown and the step-cost coefficients as unreliable.")
    return out


STEP_CHECKS_TEXT = (
    "Invariants of the per-step timing (metrics.step_checks; `prefixstudy check` runs them on any run). A step "
    "that computes prompt tokens right after a decode-only step with no more decode tokens does more work, "
    "so at most 5 % of such pairs may be shorter beyond noise (1 ms, or 10 % of the decode step). At most half "
    "of the steps with prompt tokens may be faster than their batch's median decode-only step in the same point "
    "(a sign test, 3 standard errors). A fit on sums of 32 consecutive steps, which cancels any time moved "
    "between neighbouring records, must attribute the same busy time to prefill, to decode and in total as the "
    "per-step fit, within 5 %. A point's step times add up to no more than its wall time."
)
