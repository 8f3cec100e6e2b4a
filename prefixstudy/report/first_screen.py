"""Stage: report (first screen).  What a reader sees before scrolling: headline.csv as a table, the
"why" in two sentences computed from it, and E2E against the actual arrival rate with intervals.
Each compares headline.csv's two arms (``arms``: the arm and its baseline, ON and OFF by default).

Conventions: ≥ / ≤ before a number mark a bound (a saturated mode's latency grows with how long
the point ran, so a gain measured there is a bound), ⚠ a gain where both modes saturated, which
bounds nothing; intervals are 95 % (see metrics.headline).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from prefixstudy.config.arms import arm_label
from prefixstudy.report.figure_kit import MODE_COLORS, MODE_LABELS, MODES, new_figure
from prefixstudy.report.tables import bound_mark, fmt, pct


def _ci(v, lo, hi, spec=".0f", scale=1.0, unit="") -> str:
    if not (isinstance(v, float) and math.isfinite(v)):
        return "–"
    return f"{fmt(v * scale, spec)}{unit} [{fmt(lo * scale, spec)}, {fmt(hi * scale, spec)}]"


def _bound(h: pd.Series, arms: tuple[str, str] = MODES) -> str:
    """The arm's gain over its baseline at a saturated point (tables.bound_mark)."""
    return bound_mark(bool(h[f"{arms[0]}_saturated"]), bool(h[f"{arms[1]}_saturated"])) if h["gain_is_bound"] else ""


def headline_table(head: pd.DataFrame, arms: tuple[str, str] = MODES) -> pd.DataFrame:
    (a, b), (la, lb) = arms, (arm_label(arms[0]), arm_label(arms[1]))
    rows = []
    for _, h in head.sort_values("arrival_rate").iterrows():
        sat = [arm_label(m) for m in arms if h[f"{m}_saturated"]]
        rows.append({
            "rate (req/s): actual (set)": f"{fmt(h['arrival_rate'], '.2f')} ({h['rate']:g})",
            "repeats": str(int(h["n_repeats"])),
            f"{la} mean E2E (ms)": _ci(h[f"{a}_mean_e2e_ms"], h[f"{a}_mean_e2e_lo"], h[f"{a}_mean_e2e_hi"]),
            f"{lb} mean E2E (ms)": _ci(h[f"{b}_mean_e2e_ms"], h[f"{b}_mean_e2e_lo"], h[f"{b}_mean_e2e_hi"]),
            f"{la} / {lb} p90 E2E (ms)": f"{fmt(h[f'{a}_p90_e2e_ms'], '.0f')} / {fmt(h[f'{b}_p90_e2e_ms'], '.0f')}",
            "gain, mean E2E": _bound(h, arms) + _ci(h["gain_mean_e2e"], h["gain_mean_e2e_lo"], h["gain_mean_e2e_hi"],
                                                    spec=".1f", scale=100, unit=" %"),
            f"engine prefill share {la} / {lb}": f"{pct(h[f'{a}_engine_prefill_share'])} / "
                                                 + _ci(h[f"{b}_engine_prefill_share"],
                                                       h[f"{b}_engine_prefill_share_lo"],
                                                       h[f"{b}_engine_prefill_share_hi"], scale=100, unit=" %"),
            f"{lb} decode slowdown": _ci(h[f"{b}_decode_slowdown"], h[f"{b}_decode_slowdown_lo"],
                                         h[f"{b}_decode_slowdown_hi"], spec=".2f", unit="×"),
            f"hit rate {la} (expected)": f"{fmt(h[f'{a}_hit_rate'], '.3f')} "
                                         f"({fmt(h[f'{a}_hit_rate_expected'], '.3f')})",
            f"TPOT {la} / {lb} (ms)": f"{fmt(h[f'{a}_mean_tpot_ms'], '.2f')} / {fmt(h[f'{b}_mean_tpot_ms'], '.2f')}",
            f"run-to-run spread {la} / {lb}": f"{fmt(h[f'{a}_spread_pct'], '.1f')} / "
                                              f"{fmt(h[f'{b}_spread_pct'], '.1f')} %",
            "saturated": ", ".join(sat) or "no",
        })
    return pd.DataFrame(rows)


NO_STEPS = "This backend records no engine steps, so there is no engine-level prefill share."


def no_share_reason(manifest: dict) -> str:
    """Why a run's report has no engine-level prefill share, where it has none: its steps were
    simulated, stamped on the host under async scheduling, or not recorded."""
    if manifest.get("sim"):
        return ("A simulated run prices its steps with the calibration's step-cost model rather than timing "
                "them, so there is no engine-level prefill share.")
    if "engine-async" in (manifest.get("step_timing") or []):
        return ("Its engine ran with async scheduling and no GPU timer, so its host-stamped steps are not "
                "per-step costs and there is no engine-level prefill share.")
    return NO_STEPS


def why_sentences(head: pd.DataFrame, arms: tuple[str, str] = MODES, no_share: str = NO_STEPS) -> list[str]:
    """The study's answer in two sentences, every number from headline.csv: what caching (or the
    arm compared) saves over the baseline at the lowest rate and at the highest that kept up.
    ``no_share``: why there is no engine-level prefill share, where there is none
    (``no_share_reason``)."""
    (a, b), lb = arms, arm_label(arms[1])
    who = "caching" if arms == MODES else arm_label(a)
    h = head.sort_values("arrival_rate")
    h = h[h["gain_mean_e2e"].notna()]  # rates where both arms were measured
    if h.empty:
        return []
    lo = h.iloc[0]
    both = h[~h[f"{a}_saturated"] & ~h[f"{b}_saturated"]]
    hi = both.iloc[-1] if len(both) else h.iloc[-1]
    saved = lo[f"{b}_mean_e2e_ms"] - lo[f"{a}_mean_e2e_ms"]
    share_lo, share_hi, slow_hi = (lo[f"{b}_engine_prefill_share"], hi[f"{b}_engine_prefill_share"],
                                   hi[f"{b}_decode_slowdown"])
    of = f"{lo[f'{b}_mean_e2e_ms']:.0f} ms" if arms == MODES else f"{lb}'s {lo[f'{b}_mean_e2e_ms']:.0f} ms"
    first = (f"At {lo['arrival_rate']:.2f} req/s {who} saves {saved:.0f} ms of {of} "
             f"(gain {_ci(lo['gain_mean_e2e'], lo['gain_mean_e2e_lo'], lo['gain_mean_e2e_hi'], '.1f', 100, ' %')})"
             + (f", about one prefill: prompts take only {pct(share_lo)} of {lb}'s busy engine time."
                if math.isfinite(share_lo) and arms == MODES else "."))
    where = 'the highest rate where neither mode saturated' if len(both) else 'the highest rate'
    engine = ""
    if math.isfinite(share_hi) and math.isfinite(slow_hi):
        engine = (f"prompts take {pct(share_hi)} of {lb}'s engine time and every decode step is "
                  f"{fmt(slow_hi, '.2f')}× as long as it would be without the prefills it carries, so ")
    second = (f"At {hi['arrival_rate']:.2f} req/s, {where}, {engine}{who} cuts mean E2E by {_bound(hi, arms)}"
              f"{_ci(hi['gain_mean_e2e'], hi['gain_mean_e2e_lo'], hi['gain_mean_e2e_hi'], '.1f', 100, ' %')}.")
    if not engine:
        second += " " + no_share
    return [first, second]


def e2e_with_intervals(head: pd.DataFrame, arms: tuple[str, str] = MODES) -> Figure:
    """Mean E2E (solid, 95 % interval as bars) and p90 (dashed) vs the actual arrival rate, log y so
    low load stays readable; a hollow marker is a saturated rate (a lower bound on its latency)."""
    fig = new_figure()
    ax = fig.add_subplot()
    h = head.sort_values("arrival_rate")
    x = h["arrival_rate"].to_numpy(float)
    for mode in arms:
        c = MODE_COLORS[mode]
        y = h[f"{mode}_mean_e2e_ms"].to_numpy(float)
        err = np.vstack([y - h[f"{mode}_mean_e2e_lo"].to_numpy(float), h[f"{mode}_mean_e2e_hi"].to_numpy(float) - y])
        sat = h[f"{mode}_saturated"].to_numpy(bool)
        ax.errorbar(x, y, yerr=np.clip(err, 0, None), color=c, capsize=3, lw=1.5, label=f"{MODE_LABELS[mode]} mean")
        ax.plot(x[~sat], y[~sat], "o", color=c, ms=5)
        ax.plot(x[sat], y[sat], "o", mfc="white", mec=c, ms=8, mew=1.5)
        ax.plot(x, h[f"{mode}_p90_e2e_ms"], "--", color=c, lw=1, label=f"{MODE_LABELS[mode]} p90")
    ax.plot([], [], "o", mfc="white", mec="black", label="saturated (a bound)")
    ax.set_yscale("log")
    ax.set_xlabel("actual arrival rate (req/s), mean over repeats")
    ax.set_ylabel("E2E latency (ms), log scale")
    ax.set_title("End-to-end latency vs load, 95 % intervals over repeats (this machine)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return fig
