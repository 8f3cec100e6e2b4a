"""Stage: report (saturation codes).  summary.csv's ``saturation_reason`` in one word per rule.

``metrics.saturation.saturation`` writes one clause per rule that fired, joined by "; ".  Each rule
gets a short code here, so a table can say which rules fired at a rate in a cell, with the legend
(``LEGEND``) once below it; the clauses in full stay in summary.csv and in the report's Saturation
section (``reasons_table``).
"""

from __future__ import annotations

import math
import re

import pandas as pd

from prefixstudy.config.arms import arm_label
from prefixstudy.metrics.saturation import COMPLETION_MIN, FULL_LEVEL, FULL_SHARE, WAIT_SHARE

# Rule -> (code, how its clause in saturation_reason starts), in the rules' order.
RULES = (("open", re.compile(r"\d+ unfinished")),
         ("behind", re.compile(r"completed ")),
         ("full", re.compile(r"ran full")),
         ("waiting", re.compile(r"requests waited")),
         ("grew", re.compile(r"backlog grew")))
OTHER = "other"
LEGEND = {
    "open": "a request was still open at the point's end",
    "behind": f"under {COMPLETION_MIN:.0%} of the arrivals completed in the window",
    "full": f"≥ {FULL_LEVEL:.0%} of the engine's request limit in use through {FULL_SHARE:.0%} of the window's last half",
    "waiting": f"requests waited for admission in ≥ {WAIT_SHARE:.0%} of the steps of the window's last half",
    "grew": "the backlog grew (a trend test: on long windows, or where the server's limit is unknown)",
    OTHER: "a reason this report has no code for (in full in the Saturation section)",
}
# The same, in a few words: the first screen's legend.
SHORT = {
    "open": "request open at end",
    "behind": f"< {COMPLETION_MIN:.0%} done in time",
    "full": f"≥ {FULL_LEVEL:.0%} of request limit",
    "waiting": "requests waited",
    "grew": "backlog grew (trend test)",
    OTHER: "see Saturation below",
}
_CLAUSE = re.compile(r";\s+(?![^(]*\))")  # "; " outside parentheses (rule 5's clause holds one)


def codes(reason: str) -> list[str]:
    """The codes of one point's ``saturation_reason``, in the rules' order; [] where it is blank."""
    found = set()
    for clause in _CLAUSE.split(str(reason or "").strip()):
        if clause:
            found.add(next((c for c, start in RULES if start.match(clause)), OTHER))
    return [c for c, _ in RULES if c in found] + ([OTHER] if OTHER in found else [])


def _repeats(summary: pd.DataFrame, mode: str, rate: float) -> pd.DataFrame:
    s = summary[(summary["mode"] == mode) & (summary["rate"].astype(float).round(9) == round(float(rate), 9))]
    return s[s["status"].astype(str) != "failed"] if "status" in s else s


def _saturated(s: pd.DataFrame) -> pd.Series:
    return s["saturated"].astype(str).str.strip().str.lower().isin(("true", "1", "yes"))


def cell(summary: pd.DataFrame, arms: tuple[str, ...], rate: float, label: bool = True, none: str = "no") -> str:
    """Which of ``arms`` saturated at the configured ``rate``, and how: "OFF full+waiting", with
    "(k/n)" where only k of its n repeats did; ``none`` where none did.  ``label``: name the arm."""
    out = []
    for mode in arms:
        s = _repeats(summary, mode, rate)
        sat = s[_saturated(s)]
        if not len(sat):
            continue
        found = set().union(*(codes(r) for r in sat.get("saturation_reason", pd.Series(dtype=str)).fillna("")))
        word = "+".join(c for c in [*LEGEND] if c in found)
        share = f" ({len(sat)}/{len(s)})" if len(sat) < len(s) else ""
        out.append(f"{arm_label(mode) if label else ''}{share} {word}".strip())
    return "; ".join(out) or none


def legend(used: set[str], texts: dict[str, str] = SHORT) -> str:
    """The codes in ``used``, each with its rule (``SHORT`` or ``LEGEND``), in one line."""
    return "; ".join(f"{c}: {text}" for c, text in texts.items() if c in used)


def used_codes(cells) -> set[str]:
    return {c for text in cells for c in re.findall(r"[a-z]+", str(text)) if c in LEGEND}


def reasons_table(summary: pd.DataFrame) -> pd.DataFrame:
    """Every saturated repeat: arm, configured and actual rate, repeat, its codes and its reason in full."""
    if not len(summary) or "saturated" not in summary:
        return pd.DataFrame()
    s = summary[_saturated(summary)]
    rows = []
    for _, r in s.sort_values(["mode", "rate"] + (["repeat"] if "repeat" in s else [])).iterrows():
        actual = float(r.get("arrival_rate", math.nan))
        rows.append({"arm": arm_label(str(r["mode"])), "rate (req/s): actual (set)":
                     (f"{actual:.2f} " if math.isfinite(actual) else "") + f"({float(r['rate']):g})",
                     "repeat": str(int(r.get("repeat", 0))), "codes": "+".join(codes(r.get("saturation_reason", ""))),
                     "reason": str(r.get("saturation_reason") or "")})
    return pd.DataFrame(rows)
