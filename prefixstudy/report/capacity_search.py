"""A capacity search's answer (a run with ``sweep.capacity_search``): each arm's bracket on its
highest sustained arrival rate and the capacity ratio against the baseline arm, for the console
and the report's Capacity section.  It reads capacity.csv; nothing is searched here.
(``report.capacity`` is the KV-capacity sweep's report, another meaning of the word.)"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from prefixstudy.config.arms import arm_label
from prefixstudy.config.capacity_search import CapacitySearchConfig
from prefixstudy.report.tables import fmt

from prefixstudy.metrics.capacity_search import CAPACITY_CSV

TEXT = ("Each arm's capacity was searched: the rate grew geometrically until a point was not sustained (it "
        "saturated or a request did not succeed). Then rates next to the ceiling, and geometric midpoints, narrowed "
        "the bracket, and a repeat confirmed each end's verdict. Rates are actual arrival rates: the fastest "
        "sustained window at the lower end, the slowest unsustained one at the upper end. The ceiling is the most "
        "completions per second of a saturated point: what the engine delivered overloaded, less the work on "
        "requests that timed out. The ratio's bounds are the two brackets' (arm's sustained over baseline's "
        "saturated, and the reverse): the search's resolution, not a statistical interval.")


def settings_line(s: CapacitySearchConfig, num_requests: int, cap_s: float) -> str:
    """--dry-run's line: what the search will do."""
    return (f"capacity search: from {s.start_rate:g} req/s x{s.growth:g} (range {s.min_rate:g}-{s.max_rate:g}), "
            f"bisect to {1 + s.tolerance:.2f}x, {s.confirm_repeats} repeats at each end (up to {s.max_end_repeats}); "
            f"windows {s.short_window_s:g} s "
            f"on the growth grid, {s.edge_window_s:g} s near the edge (>= {num_requests} requests), points capped "
            f"at {cap_s:g} s")


def read(run_dir: Path) -> pd.DataFrame | None:
    path = Path(run_dir) / CAPACITY_CSV
    if not path.is_file():
        return None
    df = pd.read_csv(path)
    for c in ("stopped", "saturated_reasons", "contradictions", "baseline"):
        df[c] = df[c].fillna("").astype(str)
    return df


def _bracket(r) -> str:
    lo, hi = r["sustained_req_s"], r["saturated_req_s"]
    if not math.isfinite(lo) and not math.isfinite(hi):
        return "no bracket"
    return f"[{fmt(lo, '.3g')}, {fmt(hi, '.3g')}) req/s" + (f" ({r['bracket_width']:.3g}x)"
                                                         if math.isfinite(r["bracket_width"]) else "")


def _ratio(r) -> str:
    if r["ratio_hi"] == math.inf:  # the arm sustained max_rate: no upper end
        return f"at least {fmt(r['ratio_lo'], '.3g')}"
    return f"{fmt(r['ratio_vs_baseline'], '.3g')} [{fmt(r['ratio_lo'], '.3g')}, {fmt(r['ratio_hi'], '.3g')}]"


def console_lines(run_dir: Path) -> list[str]:
    """One line per arm (its bracket, ceiling and why it stopped), one per ratio; none without capacity.csv."""
    df = read(run_dir)
    if df is None:
        return []
    out = []
    for r in df.to_dict("records"):
        line = (f"capacity {arm_label(r['mode'])}: sustained {_bracket(r)}, ceiling {fmt(r['ceiling_req_s'], '.3g')} "
                f"req/s, {r['stopped'] or 'still searching'}")
        out.append(line + (f"; contradicts: {r['contradictions']}" if r["contradictions"] else ""))
    for r in df[df["ratio_lo"].notna()].to_dict("records"):
        out.append(f"capacity ratio {arm_label(r['mode'])} / {arm_label(r['baseline'])}: {_ratio(r)}")
    return [x if len(x) <= 120 else x[:117] + "..." for x in out]


def blocks(run_dir: Path) -> list[tuple]:
    """The report's Capacity section; none without capacity.csv."""
    df = read(run_dir)
    if df is None:
        return []
    rows = []
    for r in df.to_dict("records"):
        rows.append({"arm": arm_label(r["mode"]), "sustained (req/s)": fmt(r["sustained_req_s"], ".3g"),
                     "not sustained (req/s)": fmt(r["saturated_req_s"], ".3g"),
                     "width": fmt(r["bracket_width"], ".3g"), "ceiling (req/s)": fmt(r["ceiling_req_s"], ".3g"),
                     "repeats sustained / not": f"{r['sustained_votes']} of {r['sustained_repeats']} / "
                                                f"{r['saturated_votes']} of {r['saturated_repeats']}",
                     "ratio vs baseline [bounds]": _ratio(r) if math.isfinite(r["ratio_lo"]) else "–",
                     "stopped": r["stopped"] or "still searching"})
    out = [("h2", "Capacity"), ("p", TEXT), ("table", pd.DataFrame(rows))]
    bad = [f"{arm_label(r['mode'])}: {r['contradictions']}" for r in df.to_dict("records") if r["contradictions"]]
    if bad:
        out.append(("p", "Verdicts that contradict one capacity (a rate sustained above one that was not): "
                         + "; ".join(bad) + "."))
    return out
