"""Stage: output (compare).  Several results folders in, one report overlaying them out.

``build_compare(dirs, out)`` analyzes each study as ``build_report`` does (``data.analyze``),
labels it study / device / TP, and draws the overlay figures defined here.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Mapping, Sequence
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from prefixstudy.errors import UserError
from prefixstudy.metrics.requests import parse_slo
from prefixstudy.metrics.summary import max_rate_curve
from prefixstudy.report import arms as arm_report, tables
from prefixstudy.report.data import ReportData, analyze, cold_start_notes, thresholds
from prefixstudy.config.arms import arm_label
from prefixstudy.report.figure_kit import (GAIN_COLORS, MODE_COLORS, MODE_LABELS, MODES, PEER_COLORS, SAT_MARKER,
                                           SAT_SIZE, STUDY_STYLES, arms_in, legend, mode_line, new_figure, rate_axis,
                                           register_arms, sat_handle, save_all)
from prefixstudy.report.render import FORMATS, PLOTS_DIR, write_report
from prefixstudy.results import load
from prefixstudy.results.sweep_folder import cell_dirs, is_sweep


# ----------------------------------------------------------------- figures

def compare_latency(points_by_study: Mapping[str, pd.DataFrame], metric: str, tail: str = "p90") -> Figure:
    """Several studies: mean (left) and tail (right) ``metric`` vs rate.

    Colour = mode, line style and marker = study.
    """
    fig = new_figure(12.0, 5.0)
    axes = fig.subplots(1, 2)
    for ax, stat in zip(axes, ("mean", tail), strict=True):
        col = f"{stat}_{metric}_ms"
        for i, (label, p) in enumerate(points_by_study.items()):
            ls, mk = STUDY_STYLES[i % len(STUDY_STYLES)]
            for mode in arms_in(p):
                mode_line(ax, p, mode, col, ls=ls, dot=mk, label=f"{label} {MODE_LABELS[mode]}")
        rate_axis(ax, pd.concat([p["rate"] for p in points_by_study.values()]))
        ax.set_ylabel(f"{stat} {metric.upper()} latency (ms)")
        ax.set_title(f"{stat} {metric.upper()} vs offered rate")
        legend(ax, [sat_handle()])
    return fig


def compare_gain(gains_by_study: Mapping[str, pd.DataFrame]) -> Figure:
    """Several studies: caching gain of mean E2E (left) and mean TTFT (right) with CI bands."""
    fig = new_figure(12.0, 5.0)
    axes = fig.subplots(1, 2)
    for ax, metric in zip(axes, ("e2e_ms", "ttft_ms"), strict=True):
        for i, (label, grp) in enumerate(gains_by_study.items()):
            ls, mk = STUDY_STYLES[i % len(STUDY_STYLES)]
            g = grp[grp["metric"] == metric].sort_values("rate")
            c = PEER_COLORS[i % len(PEER_COLORS)] if i else GAIN_COLORS[metric]
            ax.fill_between(g["rate"], 100 * g["ci_lo"], 100 * g["ci_hi"], color=c, alpha=0.15)
            ax.plot(g["rate"], 100 * g["gain"], ls=ls, marker=mk, color=c, label=label)
            if "saturated" in g:
                s = g[g["saturated"].astype(bool)]
                ax.plot(s["rate"], 100 * s["gain"], ls="none", marker=SAT_MARKER, color=c,
                        ms=SAT_SIZE, markeredgecolor="black")
        ax.axhline(0, color="black", lw=0.8)
        rate_axis(ax, pd.concat([g["rate"] for g in gains_by_study.values()]))
        name = metric.removesuffix("_ms").upper()
        ax.set_ylabel(f"gain of mean {name}, (OFF - ON) / OFF (%)")
        ax.set_title(f"Caching gain, {name}")
        legend(ax, [sat_handle()])
    return fig


def compare_max_rate(curves_by_study: Mapping[str, pd.DataFrame], title: str) -> Figure:
    """Several studies: highest rate meeting a p90 threshold vs the threshold."""
    fig = new_figure()
    ax = fig.add_subplot()
    for i, (label, c) in enumerate(curves_by_study.items()):
        ls, _ = STUDY_STYLES[i % len(STUDY_STYLES)]
        for mode in arms_in(c):
            g = c[c["mode"] == mode].sort_values("threshold_ms")
            if not g.empty:
                ax.step(g["threshold_ms"], g["max_rate"].fillna(0.0), where="post", ls=ls,
                        color=MODE_COLORS[mode], label=f"{label} {MODE_LABELS[mode]}")
    ax.set_xscale("log")
    ax.set_xlabel(f"{title} threshold (ms)")
    ax.set_ylabel("highest offered rate meeting it (req/s)")
    ax.set_title(f"Max sustainable rate at {title} <= threshold (unsaturated points only)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return fig


# ----------------------------------------------------------------- the report

def expand_sweeps(results_dirs: Sequence[str | Path]) -> list[tuple[Path, str]]:
    """Each folder to compare, with a sweep's parent replaced by its started cells in the grid's
    order: (folder, the cell's name, "" for a plain study)."""
    out: list[tuple[Path, str]] = []
    for rd in map(Path, results_dirs):
        if is_sweep(rd):
            cells = cell_dirs(rd)
            if not cells:
                raise UserError(f"{rd}: a sweep with no cell started; nothing to compare")
            out += [(c, c.name) for c in cells]
        else:
            out.append((rd, ""))
    return out


def _analyze_all(folders: list[tuple[Path, str]], slo: dict[str, float], threshold_ms: float | None,
                 n_boot: int, seed: int) -> tuple[list[str], list[ReportData]]:
    """ReportData of every study (``expand_sweeps``' folders), and its label (with the cell's name,
    and the run id where two labels are the same)."""
    datas: list[ReportData] = []
    cells: list[str] = []  # a sweep's cell: its folder's name, beside the study's label
    for rd, cell in folders:
        s = load(rd)
        if s.requests.empty:
            raise UserError(f"{s.path}: no requests recorded; nothing to compare")
        datas.append(analyze(s, slo, threshold_ms, n_boot=n_boot, seed=seed))
        cells.append(cell)
    labels = [f"{d.label} [{cell}]" if cell else d.label for d, cell in zip(datas, cells, strict=True)]
    for i, d in enumerate(datas):
        if labels.count(d.label) > 1:
            labels[i] = f"{d.label} ({d.study.path.name})"
    return labels, datas


def _figure_specs(labels: list[str], datas: list[ReportData]) -> list[tuple]:
    pts = {lab: d.done for lab, d in zip(labels, datas, strict=True)}
    gains = {}
    for lab, d in zip(labels, datas, strict=True):
        sat = d.points.groupby("rate")["saturated"].any().rename("saturated").reset_index()
        gains[lab] = d.gains.merge(sat, on="rate", how="left")
    curves = {}
    for metric, title in (("p90_e2e_ms", "p90 E2E"), ("p90_ttft_ms", "p90 TTFT")):
        th = thresholds(pd.concat([p[metric] for p in pts.values()]))
        curves[title] = {lab: max_rate_curve(d.done, metric, th, modes=list(dict.fromkeys([*d.arms, *d.done["mode"]])))
                         for lab, d in zip(labels, datas, strict=True)}
    return [
        ("compare_e2e", lambda: compare_latency(pts, "e2e"), "Mean and p90 E2E vs offered rate."),
        ("compare_ttft", lambda: compare_latency(pts, "ttft"), "Mean and p90 TTFT vs offered rate."),
        ("compare_gain", lambda: compare_gain(gains), "Caching gain with 95 % bootstrap CIs."),
        ("compare_max_rate_e2e", lambda: compare_max_rate(curves["p90 E2E"], "p90 E2E"),
         "Highest rate meeting a p90 E2E threshold."),
        ("compare_max_rate_ttft", lambda: compare_max_rate(curves["p90 TTFT"], "p90 TTFT"),
         "Highest rate meeting a p90 TTFT threshold."),
    ]


def side_by_side(labels: list[str], datas: list[ReportData]) -> pd.DataFrame:
    rows = []
    for lab, d in zip(labels, datas, strict=True):
        h, rt, (a, b) = d.headline, tables.rate_text, d.arms  # each study's arm and baseline
        rows.append({"study": lab, "run": str(d.study.path), "vLLM": str(d.study.manifest.get("vllm_version") or "n/a"),
                     f"knee {arm_label(a)} (req/s)": rt(d.knees[a]), f"knee {arm_label(b)} (req/s)": rt(d.knees[b]),
                     "p90 E2E threshold (ms)": tables.fmt(h["threshold_ms"]),
                     f"{arm_label(a)} sustains (req/s)": rt(h["sustains"][a][0]),
                     f"{arm_label(b)} sustains (req/s)": rt(h["sustains"][b][0])})
    return pd.DataFrame(rows)


def build_compare(results_dirs: Sequence[str | Path], out_dir: str | Path,
                  slo: dict[str, float] | str | None = None, threshold_ms: float | None = None, *,
                  n_boot: int = 1000, seed: int = 0, formats: Sequence[str] = FORMATS) -> Path:
    """Overlay several studies (labelled study / device / TP) in one report in ``out_dir``."""
    folders = expand_sweeps(results_dirs)
    if len(folders) < 2:
        raise UserError("compare needs at least two results folders (or a sweep of two cells or more)")
    slo = parse_slo(slo) if isinstance(slo, str) or slo is None else dict(slo)
    out_dir = Path(out_dir)
    labels, datas = _analyze_all(folders, slo, threshold_ms, n_boot, seed)
    register_arms(list(dict.fromkeys(m for d in datas for m in (d.study.config.get("sweep") or {}).get("modes") or MODES)))
    figs = save_all(_figure_specs(labels, datas), out_dir / PLOTS_DIR, formats)
    blocks: list[tuple] = [("meta", f"Compared {len(datas)} studies on "
                            f"{_dt.datetime.now().astimezone().isoformat(timespec='seconds')}.")]
    for lab, d in zip(labels, datas, strict=True):
        blocks += [("h2", lab), ("meta", tables.meta_line(d.study))]
        if arm_report.shown(d.study.arms):
            blocks += [("headline", t) for t in arm_report.sentences(d.study.arms)]
            blocks += [("table", arm_report.table(d.study.arms))]
        blocks += [("headline", t) for t in tables.headline_paragraphs(d)]
        cold = cold_start_notes(d.study.manifest)
        if cold:  # a study whose cold starts were not all proven: flagged beside its numbers
            blocks += [("list", cold)]
    blocks += [("h2", "Side by side"), ("table", side_by_side(labels, datas)),
               ("p", "Line style and marker tell studies apart; colour is the arm (ON blue, OFF orange, every "
                     "other arm its own, the same in every figure); an X is a saturated point.")]
    blocks += [("fig", f) for f in figs]
    blocks += [("h2", "Definitions"), ("p", tables.SATURATION_TEXT)]
    return write_report(blocks, "Prefix caching studies compared", out_dir)
