"""Stage: report (routing sweep).  The tables of ``metrics.replicas`` in; ``routing.md``,
``routing.html`` and ``plots/routing_*.png`` / ``.svg`` at the sweep's parent out.

Both documents come from one block list (``render.render``), so they never disagree; the HTML embeds
every figure.  Figures follow ``figures``' conventions: caching ON is tab:blue, OFF tab:orange;
policies differ by line style and marker (``STUDY_STYLES``, in the order the sweep ran them); a
saturated point (``saturated_share`` > 0: some repeat saturated) is drawn as an X.  In tables the
rate of such a point carries ``SAT_MARK`` (the HTML shades its row) and its mean E2E a ``≥``: a
saturated point's latency grows with how long it ran, so it is a lower bound.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from prefixstudy.metrics import replicas as rm
from prefixstudy.report.figure_kit import (CDF_CMAPS, MODE_COLORS, MODE_LABELS, SAT_MARKER, SAT_SIZE,
                                           STUDY_STYLES, arms_in, legend, new_figure, rate_axis, sat_handle, save_all)
from prefixstudy.report.render import FORMATS, PLOTS_DIR, SavedFigure, render
from prefixstudy.report.tables import fmt_df, mark
from prefixstudy.results import atomic_write_text

ROUTING_MD = "routing.md"
ROUTING_HTML = "routing.html"
POLICY_COLUMNS = ["policy", "mode", "rate", "arrival_rate", "hit_rate_measured", "hit_rate_expected", "mean_e2e_ms",
                  "mean_e2e_lo", "mean_e2e_hi", "mean_ttft_ms", "mean_tpot_ms", "requests_imbalance",
                  "busy_imbalance", "saturated_share"]
SUMMARY_COLUMNS = ["policy", "mode", "rate", "replica", "n_repeats", "n_routed", "n_ok", "hit_rate_measured",
                   "busy_s", "mean_e2e_ms", "mean_e2e_lo", "mean_e2e_hi", "saturated_share"]
REPEAT_COLUMNS = ["policy", "mode", "rate", "repeat", "replica", "n_routed", "n_ok", "hit_rate_measured", "busy_s",
                  "mean_e2e_ms", "saturated"]
SAT_TEXT = ("A rate marked ⚠ saturated in some repeat (metrics.saturation): its latency grows with how long the "
            "point ran, so its mean E2E is a lower bound (≥); figures draw it as an X. Intervals are 95 %: "
            "repeats, then blocks of consecutive requests, resampled (shared.bootstrap).")


# ----------------------------------------------------------------- tables

def display_table(df: pd.DataFrame, columns: list[str], sat: pd.Series) -> pd.DataFrame:
    """``df``'s ``columns`` as text: 4 significant digits, ``SAT_MARK`` on the rate and ``≥`` on the
    mean E2E of rows where ``sat`` (aligned with ``df``) is true."""
    sat = sat.fillna(False).astype(bool).to_numpy()
    out = fmt_df(df[columns].reset_index(drop=True))
    out["rate"] = [mark(float(r), s) for r, s in zip(df["rate"], sat, strict=True)]
    if "mean_e2e_ms" in out:
        out["mean_e2e_ms"] = [f"≥ {v}" if s else v for v, s in zip(out["mean_e2e_ms"], sat, strict=True)]
    return out


def _ordered(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    return df.sort_values(keys, kind="stable") if len(df) else df


# ----------------------------------------------------------------- figures

def _x(t: pd.DataFrame) -> np.ndarray:
    """The actual arrival rate, the set rate where a run recorded none."""
    x = t["arrival_rate"] if "arrival_rate" in t else pd.Series(math.nan, index=t.index)
    return x.fillna(t["rate"]).to_numpy(float)


def _lines(ax, table: pd.DataFrame, policies: list[str], col: str, errors: tuple[str, str] | None = None) -> None:
    """One line per policy x mode of ``col`` vs the actual arrival rate; X where saturated."""
    for i, policy in enumerate(policies):
        ls, marker = STUDY_STYLES[i % len(STUDY_STYLES)]
        for mode in arms_in(table):
            g = table[(table["policy"] == policy) & (table["mode"] == mode)]
            if g.empty:
                continue
            g = g.assign(_x=_x(g)).sort_values("_x")
            x, y, c = g["_x"].to_numpy(float), g[col].to_numpy(float), MODE_COLORS[mode]
            sat = g["saturated_share"].fillna(0).to_numpy(float) > 0
            yerr = None
            if errors:
                lo, hi = (g[e].to_numpy(float) for e in errors)
                yerr = np.clip(np.nan_to_num(np.vstack([y - lo, hi - y])), 0, None)
            ax.errorbar(x, y, yerr=yerr, ls=ls, color=c, capsize=3 if errors else 0, lw=1.4,
                        label=f"{policy}, {MODE_LABELS[mode]}")
            ax.plot(x[~sat], y[~sat], ls="none", marker=marker, color=c, ms=5)
            ax.plot(x[sat], y[sat], ls="none", marker=SAT_MARKER, color=c, ms=SAT_SIZE,
                    markeredgecolor="black", markeredgewidth=0.8)


def _rate_axis(ax, table: pd.DataFrame) -> None:
    rate_axis(ax, _x(table))
    ax.set_xlabel("actual arrival rate (req/s), mean over repeats")


def e2e_by_policy(table: pd.DataFrame, policies: list[str]) -> Figure:
    """Mean E2E with its 95 % interval vs the actual arrival rate, one line per policy x mode."""
    fig = new_figure()
    ax = fig.add_subplot()
    _lines(ax, table, policies, "mean_e2e_ms", ("mean_e2e_lo", "mean_e2e_hi"))
    y = table["mean_e2e_ms"].to_numpy(float)
    y = y[np.isfinite(y) & (y > 0)]
    if y.size and y.max() / y.min() >= 10:  # low load stays readable beside a saturated point
        ax.set_yscale("log")
    _rate_axis(ax, table)
    ax.set_ylabel("mean E2E latency (ms)")
    ax.set_title("Mean end-to-end latency by routing policy, 95 % intervals")
    legend(ax, [sat_handle()])
    return fig


def hit_rate_by_policy(table: pd.DataFrame, policies: list[str]) -> Figure:
    """Measured prefix hit rate (prompt tokens served from the cache) vs the actual arrival rate."""
    fig = new_figure()
    ax = fig.add_subplot()
    _lines(ax, table, policies, "hit_rate_measured")
    _rate_axis(ax, table)
    ax.set_ylim(-0.02, 1.02)
    ax.set_ylabel("prefix hit rate (share of prompt tokens)")
    ax.set_title("Prefix hit rate by routing policy")
    legend(ax, [sat_handle()])
    return fig


def imbalance_by_policy(table: pd.DataFrame, policies: list[str]) -> Figure:
    """Max / mean over replicas of requests routed (left) and of busy time (right), vs rate."""
    fig = new_figure(11.0, 4.6)
    axes = fig.subplots(1, 2, sharey=True)
    for ax, (col, what) in zip(axes, (("requests_imbalance", "requests routed"), ("busy_imbalance", "busy time")), strict=True):
        _lines(ax, table, policies, col)
        ax.axhline(1.0, color="gray", lw=0.8, ls=":")
        _rate_axis(ax, table)
        ax.set_title(f"Imbalance of {what}: max / mean over replicas")
    axes[0].set_ylabel("max / mean (1 = even)")
    legend(axes[0], [sat_handle()])
    return fig


def replica_load(summary: pd.DataFrame, policies: list[str]) -> Figure:
    """Each replica's share of its point's busy time (all repeats), one bar per replica, grouped by
    policy and rate; one panel per mode, replicas shaded in the mode's colours.  The number on a
    bar is the requests routed to it; red edge and X: the replica saturated in some repeat."""
    from matplotlib import colormaps

    modes = arms_in(summary)
    groups = [(p, r) for p in policies for r in sorted(summary.loc[summary["policy"] == p, "rate"].unique())]
    n = int(summary["replica"].max()) + 1
    fig = new_figure(max(8.0, 0.5 * n * len(groups) + 3), 4.2 * len(modes))
    axes = fig.subplots(len(modes), 1, squeeze=False)[:, 0]
    width = 0.8 / n
    for ax, mode in zip(axes, modes, strict=True):
        shades = colormaps[CDF_CMAPS.get(mode, CDF_CMAPS[0])](np.linspace(0.45, 0.95, n))
        for i, (policy, rate) in enumerate(groups):
            g = summary[(summary["policy"] == policy) & (summary["rate"] == rate) & (summary["mode"] == mode)]
            total = g["busy_s"].sum()
            for _, r in g.iterrows():
                k, sat = int(r["replica"]), r["saturated_share"] > 0
                x, h = i + (k - (n - 1) / 2) * width, (r["busy_s"] / total) if total > 0 else 0.0
                ax.bar(x, h, width * 0.95, color=shades[k], edgecolor="red" if sat else "black",
                       linewidth=1.6 if sat else 0.4, label=f"replica {k}" if i == 0 else None)
                ax.annotate(f"{int(r['n_routed'])}", (x, h), xytext=(0, 9 if sat else 2), textcoords="offset points",
                            ha="center", va="bottom", fontsize=7)
                if sat:
                    ax.plot(x, h, marker=SAT_MARKER, color=shades[k], ms=SAT_SIZE, markeredgecolor="black")
        ax.axhline(1 / n, color="gray", lw=0.8, ls=":")
        ax.set_xticks(range(len(groups)), [f"{p}\n{r:g} req/s" for p, r in groups], fontsize=8)
        ax.set_ylim(0, 1.1)
        ax.set_ylabel("share of the fleet's busy time")
        ax.set_title(f"{MODE_LABELS[mode]}: busy time per replica (label: requests routed; dotted: even)",
                     color=MODE_COLORS[mode])
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=8, ncols=min(n, 8))
    return fig


def draw_figures(table: pd.DataFrame, summary: pd.DataFrame, policies: list[str], plots_dir: Path,
                 formats=FORMATS) -> dict[str, SavedFigure]:
    specs = [
        ("routing_e2e", lambda: e2e_by_policy(table, policies),
         "Mean E2E vs the actual arrival rate, one line per policy (style) and mode (colour); bars: 95 % "
         "intervals over repeats and blocks of requests; X: saturated in some repeat (a lower bound)."),
        ("routing_hit_rate", lambda: hit_rate_by_policy(table, policies),
         "Measured prefix hit rate (share of prompt tokens served from a replica's cache) vs the actual "
         "arrival rate, per policy and mode."),
        ("routing_imbalance", lambda: imbalance_by_policy(table, policies),
         "Load balance: max / mean over replicas of requests routed and of busy time (sum of engine steps), "
         "mean over repeats; 1 is perfectly even."),
    ]
    if len(summary):
        specs.append(("routing_replicas", lambda: replica_load(summary, policies),
                      "Each replica's share of its point's busy time over all repeats, grouped by policy and "
                      "rate; the number on a bar is the requests routed to it."))
    return {f.stem: f for f in save_all(specs, plots_dir, formats)}


# ----------------------------------------------------------------- document

def routing_blocks(policies: list[str], table: pd.DataFrame, per: pd.DataFrame, summary: pd.DataFrame,
                   figs: dict[str, SavedFigure]) -> list[tuple]:
    b: list[tuple] = []
    if "prefix_affinity" in policies and len(policies) > 1:
        base = "round_robin" if "round_robin" in policies else next(p for p in policies if p != "prefix_affinity")
        b += [("h2", "Where affinity's hits outweigh its imbalance"),
              ("list", rm.verdicts(table, "prefix_affinity", base))]
    t = _ordered(table, ["rate", "mode", "policy"])
    b += [("h2", "Policies x ON/OFF at each rate"), ("p", SAT_TEXT),
          ("table", display_table(t, POLICY_COLUMNS, t["saturated_share"] > 0))]
    b += [("fig", figs[k]) for k in ("routing_e2e", "routing_hit_rate") if k in figs]
    b += [("h2", "Knees"), ("table", fmt_df(rm.knees(table)))]
    b += [("h2", "Load balance")] + [("fig", figs[k]) for k in ("routing_imbalance", "routing_replicas") if k in figs]
    if len(summary):
        s = _ordered(summary, ["policy", "mode", "rate", "replica"])
        b += [("h2", "Per replica over its repeats"),
              ("p", "n_routed, n_ok and busy_s are totals over the repeats; mean E2E over every counted request "
                    "the replica served, with its 95 % interval (replicas_summary.csv)."),
              ("table", display_table(s, SUMMARY_COLUMNS, s["saturated_share"] > 0))]
    if len(per):
        p = _ordered(per, ["policy", "mode", "rate", "repeat", "replica"])
        b += [("h2", "Per replica, each repeat"), ("table", display_table(p, REPEAT_COLUMNS, p["saturated"]))]
    return b


def write_routing_report(parent: Path, policies: list[str], table: pd.DataFrame, per: pd.DataFrame,
                         summary: pd.DataFrame, formats=FORMATS) -> Path:
    """Draw the figures into ``parent/plots``; write routing.md and routing.html.  Returns routing.md."""
    figs = draw_figures(table, summary, policies, parent / PLOTS_DIR, formats) if len(table) else {}
    n = int(per["replica"].nunique()) if len(per) else 0
    md, page = render(routing_blocks(policies, table, per, summary, figs),
                      f"Routing: {', '.join(policies)} over {n} replicas", parent)
    atomic_write_text(parent / ROUTING_MD, md)
    atomic_write_text(parent / ROUTING_HTML, page)
    return parent / ROUTING_MD


def routing_report(parent: Path) -> Path:
    """Writes routing.csv, replicas.csv, replicas_summary.csv, routing.md, routing.html and
    plots/routing_* at ``parent``; returns routing.md."""
    from prefixstudy.schema import typed_frame
    from prefixstudy.sweep.routing_axis import REPLICAS, REPLICAS_SUMMARY, ROUTING, read_sweep

    runs = {p: v for p, v in read_sweep(parent).items() if len(v[0])}
    if not runs:  # every policy stopped before a point finished: say so rather than draw nothing
        out = parent / "routing.md"
        out.write_text("# Routing\n\nNo policy finished a point: see each policy's manifest.json (`error`).\n")
        return out
    table = rm.policy_table(runs)
    table.to_csv(parent / ROUTING, index=False)
    per = typed_frame(pd.concat([rm.replica_table(req, its).assign(policy=p) for p, (req, its, _) in runs.items()],
                                ignore_index=True), rm.REPLICAS_FIELDS)
    per.to_csv(parent / REPLICAS, index=False)
    summary = rm.replica_summary(runs)
    summary.to_csv(parent / REPLICAS_SUMMARY, index=False)
    return write_routing_report(parent, list(runs), table, per, summary)
