"""Stage: report (first screen).  What a reader sees before scrolling: E2E against the actual
arrival rate with intervals, one compact table of headline.csv (``compact_table``: a rate per row,
each arm's mean E2E, the gain, the baseline's prompt share and which saturation rules fired, blank
where none did) and
at most four one-line findings (``findings``).  Each compares headline.csv's two arms (``arms``:
the arm and its baseline, ON and OFF by default); an arm that did not run has no column, and a run
without both has no gain.  The full per-rate table (``headline_table``) and the "why" in two
sentences (``why_sentences``) come further down.

Conventions: ≥ / ≤ before a number mark a bound (a saturated mode's latency grows with how long
the point ran, so a gain measured there is a bound), ⚠ a gain where both modes saturated, which
bounds nothing; intervals are 95 % (see metrics.headline).  A number shown with or from an interval
has only the digits that interval supports (``precision``).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from prefixstudy.config.arms import arm_label
from prefixstudy.metrics.headline import knee_bracket
from prefixstudy.report import saturation_codes as sat_codes
from prefixstudy.report.data import arm_text
from prefixstudy.report.figure_kit import MODE_COLORS, MODE_LABELS, MODES, new_figure
from prefixstudy.report.precision import rounded, with_ci
from prefixstudy.report.tables import bound_mark, fmt, pct, rate_str

MAX_FINDINGS = 4
GAIN = "gain % [CI]"


def _ci(v, lo, hi, spec=".0f", scale=1.0, unit="") -> str:
    """"v unit [lo, hi]": at most ``spec``'s decimals, fewer where the interval supports fewer."""
    most = int(spec.strip(".f") or 0)
    v, lo, hi = (_float(x) for x in (v, lo, hi))
    return with_ci(v, lo, hi, scale=scale, most=most, unit=unit)


def _float(x) -> float:
    try:
        return float(x)
    except (TypeError, ValueError):
        return math.nan


def ran(head: pd.DataFrame, arms: tuple[str, str] = MODES) -> list[str]:
    """The compared arms with a measured mean E2E at some rate of headline.csv."""
    return [m for m in arms if f"{m}_mean_e2e_ms" in head and head[f"{m}_mean_e2e_ms"].notna().any()]


def _has(head: pd.DataFrame, col: str) -> bool:
    return col in head and pd.to_numeric(head[col], errors="coerce").notna().any()


def compact_table(head: pd.DataFrame, summary: pd.DataFrame, arms: tuple[str, str] = MODES) -> pd.DataFrame:
    """The first screen's table, one row per rate: the actual arrival rate, each arm's mean E2E (≥:
    it saturated, so the mean is a lower bound), the gain with its 95 % interval, the baseline's
    engine prefill share and which saturation rules fired (``saturation_codes``).  Columns of an
    arm that did not run, and of a gain or share nobody measured, are left out."""
    b, lb = arms[1], arm_label(arms[1])
    modes = ran(head, arms)
    gain = _has(head, "gain_mean_e2e")
    share = b in modes and _has(head, f"{b}_engine_prefill_share")
    rows = []
    for _, h in head.sort_values("arrival_rate").iterrows():
        row = {"rate (req/s)": rate_str(float(h["arrival_rate"]))}
        for m in modes:
            mean = rounded(_float(h[f"{m}_mean_e2e_ms"]), _float(h.get(f"{m}_mean_e2e_lo")),
                           _float(h.get(f"{m}_mean_e2e_hi")), most=0)
            row[f"{arm_label(m)} E2E (ms)"] = ("≥" if bool(h[f"{m}_saturated"]) and mean != "–" else "") + mean
        if gain:
            g = _ci(h["gain_mean_e2e"], h["gain_mean_e2e_lo"], h["gain_mean_e2e_hi"], ".1f", 100)
            row[GAIN] = ("" if g == "–" else _bound(h, arms).strip()) + g
        if share:
            row[f"{lb} prompt %"] = rounded(_float(h[f"{b}_engine_prefill_share"]),
                                                  _float(h.get(f"{b}_engine_prefill_share_lo")),
                                                  _float(h.get(f"{b}_engine_prefill_share_hi")), scale=100, most=0)
        row["saturated"] = sat_codes.cell(summary, tuple(modes), float(h["rate"]), none="")
        rows.append(row)
    return pd.DataFrame(rows)


def compact_legend(table: pd.DataFrame, head: pd.DataFrame, arms: tuple[str, str] = MODES) -> str:
    """One line under the compact table: what its columns are, and the codes it uses."""
    (la, lb), n = (arm_label(m) for m in arms), int(head["n_repeats"].max()) if "n_repeats" in head else 1
    parts = [f"{n} repeat{'s' if n > 1 else ''}"]
    if GAIN in table:
        parts.append(f"gain = ({lb} − {la}) / {lb}")
    if f"{lb} prompt %" in table:
        parts.append(f"prompt %: {lb}'s engine time")
    cells = [str(v) for c in table.columns if c != "saturated" for v in table[c]]
    marks = [m for m in ("≥", "≤") if any(v.startswith(m) for v in cells)]
    if marks:
        parts.append(f"{' / '.join(marks)}: bound")
    if any(v.startswith("⚠") for v in cells):
        parts.append("⚠: both saturated")
    used = sat_codes.used_codes(table["saturated"]) if "saturated" in table else set()
    return "; ".join(parts) + "." + (f" Saturated: {sat_codes.legend(used)}." if used else "")


def _gain_line(h: pd.Series, arms: tuple[str, str], where: str) -> str:
    (a, b), lb = arms, arm_label(arms[1])
    who = "caching's" if arms == MODES else f"{arm_label(a)}'s"
    gain = _bound(h, arms) + _ci(h["gain_mean_e2e"], h["gain_mean_e2e_lo"], h["gain_mean_e2e_hi"], ".1f", 100, " %")
    text = f"{rate_str(float(h['arrival_rate']))} req/s{where}: {who} E2E gain {gain}"
    share = _float(h.get(f"{b}_engine_prefill_share"))
    if math.isfinite(share):
        lo, hi = _float(h.get(f"{b}_engine_prefill_share_lo")), _float(h.get(f"{b}_engine_prefill_share_hi"))
        text += f"; prompts {rounded(share, lo, hi, scale=100, most=0)} % of {lb}'s engine time"
    return text + "."


def _sustains(r: tuple, top: float) -> str:
    x, lo, hi = r
    if not math.isfinite(x):
        return "no rate"
    if x == top:
        return f"≥ {x:.1f} (the highest rate run)"
    return with_ci(x, lo, hi, most=1)


def _knee(head: pd.DataFrame, mode: str) -> str:
    k = knee_bracket(head, mode)
    lo, hi = k["lo"], k["hi"]
    if math.isfinite(lo) and math.isfinite(hi):
        return f"{arm_label(mode)} {lo:.1f}–{hi:.1f}"
    if math.isfinite(lo):
        return f"{arm_label(mode)} above {lo:.1f}"
    return f"{arm_label(mode)} below {hi:.1f}" if math.isfinite(hi) else f"{arm_label(mode)} –"


def findings(head: pd.DataFrame, arms: tuple[str, str], headline: dict, lead: list[str] = ()) -> list[str]:
    """At most ``MAX_FINDINGS`` one-line findings, every number from headline.csv: ``lead`` first
    (a simulated run's caveat); the gain at the lowest rate and at the highest where neither arm
    saturated; the rate each arm sustains at the p90 threshold; each arm's knee."""
    out = list(lead)
    (a, b) = arms
    h = head.sort_values("arrival_rate")
    modes = ran(h, arms)
    g = h[h["gain_mean_e2e"].notna()] if "gain_mean_e2e" in h else h.iloc[:0]
    if len(g):
        out.append(_gain_line(g.iloc[0], arms, ""))
        calm = g[~g[f"{a}_saturated"].astype(bool) & ~g[f"{b}_saturated"].astype(bool)]
        if len(calm) and calm.iloc[-1]["rate"] != g.iloc[0]["rate"]:
            out.append(_gain_line(calm.iloc[-1], arms, " (highest unsaturated)"))
    elif len(modes) == 1:
        out.append(f"Only {arm_text(modes[0])} ran, so there is no gain to state.")
    y = headline.get("threshold_ms", math.nan)
    if modes and math.isfinite(y):
        top = float(h["arrival_rate"].max())
        sus = headline.get("sustains", {})
        said = ", ".join(f"{arm_label(m)} {_sustains(sus.get(m, (math.nan,) * 3), top)}" for m in modes)
        out.append(f"Sustained at p90 E2E ≤ {y:.0f} ms (req/s): {said}.")
    if modes:
        out.append("Knees (kept up – saturated): " + ", ".join(_knee(h, m) for m in modes) + " req/s.")
    return out[:MAX_FINDINGS]


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
    for mode in ran(h, arms):
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
