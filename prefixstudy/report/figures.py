"""Stage: output (figures).  Pure: DataFrame in, matplotlib Figure out.

The report's figures, drawn with the pieces of ``figure_kit`` (the Agg canvas, ``save``, the
arms' colours and the saturated-point marker).  Conventions in every figure: caching ON is
tab:blue, OFF is tab:orange, and a saturated point is drawn as a large ``X`` (``SAT_MARKER``)
instead of a dot (bars: red edge, hatched, and an X).

``points`` arguments are per-point tables with columns mode, rate, saturated and
the metric columns named by each function (summary.csv's rows, ReportData.points).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from prefixstudy.report.figure_kit import (CDF_CMAPS, DOT, GAIN_COLORS, MODE_COLORS, MODE_LABELS, MODES, PEER_COLORS, SAT_MARKER,
                                           SAT_SIZE, arms_in, legend, mode_line, new_figure, rate_axis, rate_str,
                                           sat_handle)

COMPONENTS = (  # (column, label, alpha, hatch) for the stacked latency bars
    ("mean_queue_ms", "queue", 0.35, ".."),
    ("mean_prefill_ms", "prefill", 1.0, ""),
    ("mean_decode_ms", "decode", 0.65, "//"),
)


# ----------------------------------------------------------------- figure 1 and 2

def latency_vs_rate(points: pd.DataFrame, metric: str, title: str,
                    peers: pd.DataFrame | None = None, tail: str = "p99") -> Figure:
    """Mean (solid) and tail percentile (dashed) of ``metric`` vs offered rate, ON vs OFF.

    ``peers``: label, rate, mean_<metric>_ms, <tail>_<metric>_ms (see bench_json.peer_points).
    """
    fig = new_figure()
    ax = fig.add_subplot()
    for mode in arms_in(points):
        mode_line(ax, points, mode, f"mean_{metric}_ms", label=f"{MODE_LABELS[mode]} mean")
        mode_line(ax, points, mode, f"{tail}_{metric}_ms", ls="--", label=f"{MODE_LABELS[mode]} {tail}")
    if peers is not None and len(peers):
        for i, (label, grp) in enumerate(peers.groupby("label", sort=False)):
            g = grp.sort_values("rate")
            c = PEER_COLORS[i % len(PEER_COLORS)]
            for col, ls, what in ((f"mean_{metric}_ms", "-", "mean"), (f"{tail}_{metric}_ms", "--", tail)):
                if col in g and g[col].notna().any():
                    ax.plot(g["rate"], g[col], ls=ls, marker="s", color=c, ms=5, alpha=0.8,
                            label=f"peer {label} {what}")
    rate_axis(ax, points["rate"])
    ax.set_ylabel(f"{metric.upper()} latency (ms)")
    ax.set_title(title)
    legend(ax, [sat_handle()])
    return fig


def e2e_vs_rate(points: pd.DataFrame, peers: pd.DataFrame | None = None) -> Figure:
    return latency_vs_rate(points, "e2e", "End-to-end latency vs offered rate", peers)


def ttft_vs_rate(points: pd.DataFrame, peers: pd.DataFrame | None = None) -> Figure:
    return latency_vs_rate(points, "ttft", "Time to first token vs offered rate", peers)


# ----------------------------------------------------------------- figure 3

def latency_breakdown(points: pd.DataFrame) -> Figure:
    """Stacked bars of mean queue / prefill / decode per rate, ON left, OFF right.

    The number on each bar is the request-level prefill share (mean prefill / mean E2E).
    """
    rates = sorted(points["rate"].unique())
    arms = arms_in(points) if set(arms_in(points)) - set(MODES) else list(MODES)  # ON and OFF keep their slots
    fig = new_figure(max(8.0, 0.3 * len(arms) * len(rates) + 3), 5.5)
    ax = fig.add_subplot()
    width = 0.8 / len(arms)
    top = 0.0
    for k, mode in enumerate(arms):
        p = points[points["mode"] == mode].set_index("rate")
        for i, rate in enumerate(rates):
            if rate not in p.index:
                continue
            r = p.loc[rate]
            x = i + (k - (len(arms) - 1) / 2) * width
            sat = bool(r.get("saturated", False)) if pd.notna(r.get("saturated", False)) else False
            bottom = 0.0
            for col, _, alpha, hatch in COMPONENTS:
                h = float(r.get(col, 0.0) or 0.0)
                if not math.isfinite(h):
                    h = 0.0
                ax.bar(x, h, width * 0.95, bottom=bottom, color=MODE_COLORS[mode], alpha=alpha,
                       hatch=hatch, edgecolor="red" if sat else "black", linewidth=1.6 if sat else 0.4)
                bottom += h
            top = max(top, bottom)
            share = r.get("prefill_share", math.nan)
            if pd.notna(share):  # above the X on a saturated bar, so the marker never hides it
                ax.annotate(f"{share:.0%}", (x, bottom), xytext=(0, 9 if sat else 2), textcoords="offset points",
                            ha="center", va="bottom", rotation=90, fontsize=7)
            if sat:
                ax.plot(x, bottom, marker=SAT_MARKER, color=MODE_COLORS[mode], ms=SAT_SIZE,
                        markeredgecolor="black", ls="none")
    ax.set_ylim(0, top * 1.25 if top > 0 else 1)
    ax.set_xticks(range(len(rates)), [rate_str(r) for r in rates])
    ax.set_xlabel("offered request rate (req/s); bars left to right: " + ", ".join(MODE_LABELS[m] for m in arms))
    ax.set_ylabel("mean latency per request (ms)")
    ax.set_title("Where the time goes: queue / prefill / decode (label: request-level prefill share)")
    handles = [Patch(facecolor=MODE_COLORS[m], label=MODE_LABELS[m]) for m in arms]
    handles += [Patch(facecolor="lightgray", alpha=a, hatch=h, edgecolor="black", label=lab)
                for _, lab, a, h in COMPONENTS]
    handles.append(Patch(facecolor="white", edgecolor="red", linewidth=1.6, label="saturated point (X)"))
    ax.legend(handles=handles, fontsize=8, ncols=2)
    ax.grid(True, axis="y", alpha=0.3)
    return fig


# ----------------------------------------------------------------- figure 4

def max_rate_vs_threshold(curves: Mapping[str, pd.DataFrame], knees: Mapping[str, float]) -> Figure:
    """The seed's graph: highest rate meeting a latency threshold, vs the threshold.

    ``curves``: title -> DataFrame(threshold_ms, mode, max_rate) (metrics.summary.max_rate_curve).
    ``knees``: mode -> knee rate; drawn as a dotted line ending in an X, because a
    curve that flattens there is limited by saturation, not by latency.
    """
    fig = new_figure(11.0, 4.8)
    axes = fig.subplots(1, len(curves), squeeze=False)[0]
    for ax, (title, c) in zip(axes, curves.items(), strict=True):
        for mode in arms_in(c):
            g = c[c["mode"] == mode].sort_values("threshold_ms")
            if g.empty:
                continue
            ax.step(g["threshold_ms"], g["max_rate"].fillna(0.0), where="post",
                    color=MODE_COLORS[mode], label=MODE_LABELS[mode], lw=2 if mode == "on" else 1.6)
            k = knees.get(mode, math.nan)
            if k is not None and math.isfinite(k):
                ax.axhline(k, color=MODE_COLORS[mode], ls=":", lw=1)
                ax.plot(g["threshold_ms"].max(), k, marker=SAT_MARKER, color=MODE_COLORS[mode],
                        ms=SAT_SIZE, markeredgecolor="black", ls="none")
        ax.set_xscale("log")
        ax.set_xlabel(f"{title} threshold (ms)")
        ax.set_ylabel("highest offered rate meeting it (req/s)")
        ax.set_title(f"Max sustainable rate at {title} <= threshold")
        ax.grid(True, which="both", alpha=0.3)
        legend(ax, [Line2D([], [], ls=":", marker=SAT_MARKER, color="black",
                            label="knee rate (last unsaturated)")], loc="upper left")
    return fig


# ----------------------------------------------------------------- figure 5

def caching_gain(gains: pd.DataFrame, saturated_rates: Sequence[float] = ()) -> Figure:
    """(OFF - ON) / OFF of mean E2E and mean TTFT vs rate, with bootstrap CI bands.

    ``gains``: rate, metric, gain, ci_lo, ci_hi (metrics.compare.caching_gain, concatenated).
    Rates where either mode saturated get an X.
    """
    fig = new_figure()
    ax = fig.add_subplot()
    sat = set(float(r) for r in saturated_rates)
    for metric, grp in gains.groupby("metric", sort=False):
        g = grp.sort_values("rate")
        c = GAIN_COLORS.get(metric, "tab:gray")
        name = metric.removesuffix("_ms").upper()
        x = g["rate"].to_numpy(float)
        y = 100 * g["gain"].to_numpy(float)
        # as floats: a rate without a gain (no request counted in a mode) holds None, an object column
        lo, hi = 100 * g["ci_lo"].to_numpy(float), 100 * g["ci_hi"].to_numpy(float)
        ax.fill_between(x, lo, hi, color=c, alpha=0.2,
                        label=f"{name} 95% bootstrap CI")
        ax.plot(x, y, color=c, marker=DOT, ms=5, label=f"mean {name} gain")
        m = np.isin(x, list(sat))
        ax.plot(x[m], y[m], ls="none", marker=SAT_MARKER, color=c, ms=SAT_SIZE, markeredgecolor="black")
    ax.axhline(0, color="black", lw=0.8)
    rate_axis(ax, gains["rate"])
    ax.set_ylabel("caching gain (OFF - ON) / OFF (%)")
    ax.set_title("What prefix caching buys, by load")
    legend(ax, [Line2D([], [], ls="none", marker=SAT_MARKER, color="white", markeredgecolor="black",
                        ms=SAT_SIZE, label="ON or OFF saturated")])
    return fig


# ----------------------------------------------------------------- figure 6

def _thin(t: np.ndarray, cols: list[np.ndarray], max_points: int) -> tuple[np.ndarray, list[np.ndarray]]:
    """At most ``max_points`` time bins, keeping each bin's maximum so no spike is lost."""
    if t.size <= max_points:
        return t, cols
    edges = np.linspace(t.min(), t.max(), max_points + 1)
    b = np.clip(np.searchsorted(edges, t, side="right") - 1, 0, max_points - 1)
    keep = np.unique(b)
    out = []
    for c in cols:
        m = np.full(max_points, -np.inf)
        np.maximum.at(m, b, c.astype(float))
        out.append(m[keep])
    return edges[keep], out


def engine_timeseries(iterations: pd.DataFrame, rate: float, saturated: Mapping[str, bool],
                      modes: Sequence[str] = MODES, max_points: int = 1500) -> Figure:
    """Running / waiting requests and prompt tokens computed per step at one rate, ON vs OFF.

    Long points are drawn from at most ``max_points`` time bins (the maximum of each bin).
    """
    fig = new_figure(9.0, 7.5)
    axes = fig.subplots(3, 1, sharex=True)
    at = iterations[np.isclose(iterations["rate"].astype(float), rate)]
    rows = (("num_running", "running requests"), ("num_waiting", "waiting requests"),
            ("prompt_tokens", "prompt tokens computed per step"))
    for mode in modes:
        g = at[at["mode"] == mode].sort_values("t_s")
        if g.empty:
            continue
        sat = bool(saturated.get(mode, False))
        label = MODE_LABELS[mode] + (" (saturated)" if sat else "")
        t, ys = _thin(g["t_s"].to_numpy(float), [g[c].to_numpy() for c, _ in rows], max_points)
        for ax, y in zip(axes, ys, strict=True):
            ax.plot(t, y, color=MODE_COLORS[mode], lw=0.9, label=label, ls="--" if sat else "-")
            if sat:
                ax.plot(t[-1], y[-1], marker=SAT_MARKER, color=MODE_COLORS[mode],
                        ms=SAT_SIZE, markeredgecolor="black", ls="none")
    for ax, (_, ylabel) in zip(axes, rows, strict=True):
        ax.set_ylabel(ylabel, fontsize=9)
        ax.grid(True, alpha=0.3)
    axes[-1].set_xlabel("time since the point's start (s)")
    axes[0].set_title(f"Engine state at {rate:g} req/s (dashed + X: saturated)")
    axes[0].legend(fontsize=8)
    return fig


# ----------------------------------------------------------------- figure 7

def e2e_cdf(requests_ok: pd.DataFrame, saturated: Mapping[tuple[str, float], bool],
            metric: str = "e2e_ms", max_points: int = 300, modes: Sequence[str] = MODES) -> Figure:
    """Empirical CDF of per-request latency at every rate: one panel per mode.

    Within a panel each rate is one curve, shaded light (low rate) to dark (high
    rate) in the mode's colour family (ON blues, OFF oranges); saturated rates are
    dashed and end in an X.  Two panels, not one per rate, keep a 20-rate sweep
    fast to draw.  Each CDF is drawn through at most ``max_points`` quantiles.
    """
    from matplotlib import cm, colors

    rates = sorted(requests_ok["rate"].unique())
    fig = new_figure(12.0, 5.0)
    axes = fig.subplots(1, 2, sharey=True, sharex=True)
    norm = colors.Normalize(vmin=0, vmax=max(len(rates) - 1, 1))
    for k, (ax, mode) in enumerate(zip(axes, modes, strict=True)):
        full = matplotlib.colormaps[CDF_CMAPS.get(mode, CDF_CMAPS[k])]
        cmap = colors.ListedColormap(full(np.linspace(0.35, 1.0, 256)))  # skip the near-white end
        shade = lambda i, cmap=cmap: cmap(norm(i))  # noqa: E731
        for i, rate in enumerate(rates):
            at = requests_ok[(requests_ok["rate"] == rate) & (requests_ok["mode"] == mode)]
            v = np.sort(at[metric].to_numpy(float))
            v = v[np.isfinite(v) & (v > 0)]
            if not v.size:
                continue
            sat = bool(saturated.get((mode, float(rate)), False))
            y = np.arange(1, v.size + 1) / v.size
            if v.size > max_points:
                y = np.linspace(y[0], 1.0, max_points)
                v = np.quantile(v, y, method="inverted_cdf")
            ax.step(v, y, where="post", color=shade(i), ls="--" if sat else "-", lw=1.2,
                    label=f"{rate_str(rate)} req/s" + (" (sat.)" if sat else ""))
            if sat:
                ax.plot(v[-1], 1.0, marker=SAT_MARKER, color=shade(i), ms=SAT_SIZE - 2,
                        markeredgecolor="black", ls="none")
        ax.set_xscale("log")
        ax.set_title(f"{MODE_LABELS[mode]}", color=MODE_COLORS[mode])
        ax.set_xlabel(f"{metric.removesuffix('_ms').upper()} latency (ms, log scale)")
        ax.grid(True, which="both", alpha=0.3)
        if not ax.get_legend_handles_labels()[0]:  # a mode this study did not run
            ax.text(0.5, 0.5, "not measured", ha="center", va="center", transform=ax.transAxes, alpha=0.6)
        elif len(rates) <= 10:
            ax.legend(fontsize=7, loc="lower right", title="offered rate", title_fontsize=7)
        else:
            cb = fig.colorbar(cm.ScalarMappable(norm=norm, cmap=cmap), ax=ax, pad=0.01)
            idx = np.unique(np.linspace(0, len(rates) - 1, 6).round().astype(int))
            cb.set_ticks(list(idx), labels=[f"{rate_str(rates[i])}" for i in idx])
            cb.set_label("offered rate (req/s)")
    axes[0].set_ylabel("fraction of requests")
    fig.suptitle("CDF of end-to-end latency at each offered rate (dashed + X: saturated)")
    return fig


# ----------------------------------------------------------------- prefill share

def prefill_share(points: pd.DataFrame) -> Figure:
    """Request-level (solid) and engine-level (dashed) prefill share vs rate, ON vs OFF."""
    fig = new_figure()
    ax = fig.add_subplot()
    for mode in arms_in(points):
        mode_line(ax, points, mode, "prefill_share", label=f"{MODE_LABELS[mode]}: request level")
        mode_line(ax, points, mode, "prefill_share_engine", ls="--",
                   label=f"{MODE_LABELS[mode]}: engine level (fit)")
    rate_axis(ax, points["rate"])
    ax.set_ylabel("prefill share (fraction)")
    ax.set_ylim(bottom=0)
    ax.set_title("Prefill share: mean prefill / mean E2E, and b * prompt tokens / busy time")
    legend(ax, [sat_handle()])
    return fig


# ----------------------------------------------------------------- gain against hit rate

def gain_vs_hit_rate(table: pd.DataFrame) -> Figure:
    """The compared arm's gain over the baseline against its measured hit rate, one curve per rate:
    mean E2E (left, 95 % interval band) and output throughput (right, t interval bars over repeats).
    ``table``: metrics.hit_rate_axis.gain_by_hit_rate's rows.  A gain where either arm saturated
    gets an X (a bound); a cell whose hit rate was off the workload's is drawn hollow."""
    fig = new_figure(11.0, 4.8)
    axes = fig.subplots(1, 2)
    rates = sorted(table["rate"].unique())
    colors = matplotlib.colormaps["viridis"](np.linspace(0.0, 0.85, max(len(rates), 1)))
    for ax, col in zip(axes, ("gain_mean_e2e", "gain_throughput"), strict=True):
        for rate, c in zip(rates, colors, strict=False):
            g = table[table["rate"] == rate].sort_values("hit_rate")
            x, y = g["hit_rate"].to_numpy(float), 100 * g[col].to_numpy(float)
            lo, hi = 100 * g[f"{col}_lo"].to_numpy(float), 100 * g[f"{col}_hi"].to_numpy(float)
            label = f"{rate_str(float(g['arrival_rate'].mean()))} req/s"
            if col == "gain_mean_e2e":
                ax.fill_between(x, lo, hi, color=c, alpha=0.2)
            else:
                ax.errorbar(x, y, yerr=[y - lo, hi - y], ls="none", color=c, capsize=3)
            ax.plot(x, y, color=c, label=label)
            ok, bound = g["hit_rate_ok"].to_numpy(bool), g["gain_is_bound"].to_numpy(bool)
            ax.plot(x[ok & ~bound], y[ok & ~bound], ls="none", marker=DOT, color=c, ms=5)
            ax.plot(x[~ok], y[~ok], ls="none", marker=DOT, mfc="white", color=c, ms=7)
            ax.plot(x[bound], y[bound], ls="none", marker=SAT_MARKER, color=c, ms=SAT_SIZE, markeredgecolor="black")
        ax.axhline(0, color="black", lw=0.8)
        ax.set_xlabel("measured hit rate (cached / prompt tokens)")
        ax.set_xlim(-0.02, 1.0)
        ax.grid(True, alpha=0.3)
    axes[0].set_ylabel("mean E2E gain (baseline - arm) / baseline (%)")
    axes[0].set_title("Latency: what caching saves")
    axes[1].set_ylabel("throughput gain (arm - baseline) / baseline (%)")
    axes[1].set_title("Throughput: output tokens per second")
    legend(axes[0], [Line2D([], [], ls="none", marker=SAT_MARKER, color="white", markeredgecolor="black",
                            ms=SAT_SIZE, label="either arm saturated (a bound)"),
                     Line2D([], [], ls="none", marker=DOT, mfc="white", color="black",
                            label="hit rate off the workload's")], loc="upper left")
    return fig
