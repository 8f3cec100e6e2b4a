"""The report's SLO search section (a run with ``sweep.slo``): each arm's highest rate meeting
the objectives, the bracket around it and why its search stopped, the gain in throughput that
caching buys there, and today's interpolation of the same points beside it.  It reads the
manifest's ``slo_search`` record and summary.csv; nothing is searched or measured here."""

from __future__ import annotations

import math

import pandas as pd

from prefixstudy.metrics import headline as hl
from prefixstudy.metrics.slo_search import gain_bracket
from prefixstudy.config.arms import arm_label
from prefixstudy.report.tables import fmt

TEXT = ("Each arm's rate was searched, not interpolated: from the start rate it grew geometrically until a point "
        "missed an objective or saturated, then bisected until the bracket's upper rate was within the tolerance of "
        "its lower one, then ran every repeat at the lower one; a rate meets the objectives only if every repeat "
        "there does (unsaturated, and every percentile at or below its bound, requests that failed or never "
        "finished counting as over it). The answer lies in [highest rate met, lowest rate missed) where latency "
        "grows with the rate. The gain's bounds are those two brackets' (arm's lowest over baseline's highest, and "
        "the reverse): a bound on the search's resolution, not a statistical interval over repeats; every probe "
        "is also in the points below. Rates searched are offered rates; the achieved column is what the "
        "final rate's points completed. The interpolated column is the headline's method on the same points (p90 "
        "E2E, linear between the rates around the crossing, on the actual arrival rate, which with few requests a "
        "point strays from the offered one), for the e2e_p90 objective alone.")

STOPPED = {"converged": "converged (the upper rate missed an objective)",
           "saturated": "converged (the upper rate saturated: the engine's limit, not the SLO's)",
           "max rate": "met at max rate (the answer is at least this)", "min rate": "missed at min rate",
           "failures": "a point failed", "max probes": "max probes reached (the bracket is the answer)"}


def objectives_text(objectives: dict[str, float]) -> str:
    return ", ".join(f"{k.replace('_p', ' p')} ≤ {v:g} ms" for k, v in objectives.items())


def interpolated(head: pd.DataFrame, mode: str, objectives: dict[str, float]) -> float:
    """The headline's interpolated rate at the e2e_p90 objective (NaN without one, or without headline.csv)."""
    t = objectives.get("e2e_p90")
    if t is None or f"{mode}_saturated" not in head:
        return math.nan
    return hl.rate_at_threshold(head, mode, t)[0]


def _achieved(summary: pd.DataFrame, mode: str, rate: float | None) -> float:
    if rate is None or summary.empty:
        return math.nan
    s = summary[(summary["mode"] == mode) & ((summary["rate"].astype(float) - rate).abs() < 1e-9)]
    return float(s["achieved_rate"].mean()) if len(s) else math.nan


def table(search: dict, summary: pd.DataFrame, head: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for mode, s in search["arms"].items():
        rows.append({"arm": arm_label(mode), "highest rate met (req/s)": fmt(s["lo_req_s"], ".3g"),
                     "lowest rate missed (req/s)": fmt(s["hi_req_s"], ".3g"),
                     "repeats met there": f"{s['repeats_met']} of {search['repeats']}" if s["lo_req_s"] else "–",
                     "achieved there (req/s)": fmt(_achieved(summary, mode, s["lo_req_s"]), ".3g"),
                     "stopped": STOPPED.get(s["stopped"] or "", "still searching (the run was cut short)"),
                     "rates tried (req/s)": ", ".join(f"{r:g}" for r in s["rates_tried_req_s"]),
                     "interpolated (req/s)": fmt(interpolated(head, mode, search["objectives_ms"]), ".3g")})
    return pd.DataFrame(rows)


def sentences(search: dict, arms: tuple[str, str], head: pd.DataFrame) -> list[str]:
    """"caching buys N× throughput at this SLO", with the brackets' bounds, and the interpolation's N×."""
    arm, base = arms
    a, b = search["arms"].get(arm), search["arms"].get(base)
    if a is None or b is None:
        return []
    slo = objectives_text(search["objectives_ms"])
    ratio, lo, hi = gain_bracket(a, b)
    if math.isnan(ratio):
        none = [arm_label(m) for m, s in ((arm, a), (base, b)) if s["lo_req_s"] is None]
        return [f"At {slo}, {' and '.join(none)} met the SLO at no rate searched; no gain to state."]
    bound = "at least " if a["hi_req_s"] is None else ""
    text = (f"At {slo}, {arm_label(arm)} sustains {a['lo_req_s']:g} req/s and {arm_label(base)} {b['lo_req_s']:g} "
            f"req/s, each searched to {search['tolerance']:.0%} and met there in {a['repeats_met']} and "
            f"{b['repeats_met']} of {search['repeats']} repeats: "
            f"{arm_label(arm)} buys {bound}{ratio:.2f}× the throughput at this SLO [{lo:.2f}, "
            + ("∞" if math.isinf(hi) else f"{hi:.2f}") + "] (the brackets' bounds). Stopped: "
            + "; ".join(f"{arm_label(m)} {STOPPED.get(s['stopped'] or '', 'still searching')}"
                        for m, s in ((arm, a), (base, b))) + ".")
    out = [text]
    ia, ib = interpolated(head, arm, search["objectives_ms"]), interpolated(head, base, search["objectives_ms"])
    if math.isfinite(ia) and math.isfinite(ib) and ib > 0:
        out.append(f"Interpolated instead, as the headline does (p90 E2E ≤ {search['objectives_ms']['e2e_p90']:g} ms "
                   f"between the rates probed): {arm_label(arm)} {ia:.3g} req/s, {arm_label(base)} {ib:.3g} req/s, "
                   f"{ia / ib:.2f}×.")
    return out


def blocks(manifest: dict, summary: pd.DataFrame, head: pd.DataFrame, arms: tuple[str, str]) -> list[tuple]:
    search = manifest.get("slo_search")
    if not search:
        return []
    return ([("h2", "Highest rate meeting the SLO, searched")]
            + [("headline", t) for t in sentences(search, arms, head)]
            + [("p", TEXT), ("table", table(search, summary, head))])
