"""The report of a shared-fraction sweep: what caching buys against the hit rate, at each load.

A sweep's parent folder holds ``sweep.json`` ({"axes": {"dataset.shared_fraction": [...]}, "cells":
[{"values": {"dataset.shared_fraction": 0.5}, "dir": "..."}, ...]}) and one run folder per cell
(``dir``, relative to the parent: a run folder, a study folder holding runs, read as its newest,
or a results root holding one study folder).
``hit_rate_report(parent)`` writes report.md, report.html, hit_rate.csv and plots/ there;
``hit_rate_report_from(runs, out)`` does the same from a mapping {shared fraction: run folder}.
The analysis is ``metrics.hit_rate_axis``; this module reads and writes."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

import pandas as pd

from prefixstudy.config.arms import arm_label
from prefixstudy.errors import UserError
from prefixstudy.metrics.hit_rate_axis import AXIS, Cell, gain_by_hit_rate, pays_from, \
    pays_sentence, top_sentences
from prefixstudy.report import figure_kit as kit
from prefixstudy.report.figures import gain_vs_hit_rate
from prefixstudy.report.render import write_report
from prefixstudy.results import MANIFEST, atomic_write_csv, find_run_dir, load
from prefixstudy.results.sweep_folder import INDEX, read_index
from prefixstudy.workloads.fixed import expected_hit_rate, shared_split

HIT_RATE_CSV = "hit_rate.csv"


def read_sweep(parent: Path) -> dict[float, Path]:
    """{shared fraction: run folder} from the sweep's index (``results.sweep_folder``); one line naming the
    file and what is wrong where it is not a sweep of the shared fraction alone."""
    path = Path(parent) / INDEX
    index = read_index(parent)
    axes = index["axes"]
    if AXIS not in axes:
        raise UserError(f"{path}: the sweep has no '{AXIS}' axis (axes: {', '.join(axes) or 'none'})")
    if len(axes) > 1:
        raise UserError(f"{path}: the hit-rate report reads one run per shared fraction; this sweep also varies "
                        f"{', '.join(a for a in axes if a != AXIS)}")
    runs: dict[float, Path] = {}
    for i, c in enumerate(index["cells"]):
        value = c.get("values", {}).get(AXIS) if isinstance(c, dict) and isinstance(c.get("values"), dict) else None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not isinstance(c.get("dir"), str):
            raise UserError(f"{path}: cell {i} has no number for '{AXIS}' and no 'dir'")
        d = Path(parent) / c["dir"]
        if not d.is_dir():
            raise UserError(f"{path}: cell {i} ({AXIS} {value}): folder {d} not found")
        runs[float(value)] = d
    if not runs:
        raise UserError(f"{path}: the sweep has no cells")
    return runs


def workload_hit_rate(config: dict, manifest: dict) -> float:
    """What the run's workload lets a warm cache serve (``workloads.fixed.expected_hit_rate``), from
    its recorded config and the block size its points recorded; NaN where it did not set a shared
    fraction or recorded no block size."""
    d = config.get("dataset") or {}
    fraction = d.get("shared_fraction")
    blocks = {p.get("block_size") for p in manifest.get("points", []) if p.get("block_size")}
    if not isinstance(fraction, (int, float)) or len(blocks) != 1:
        return math.nan
    prompt = int(d["prefix_len"]) + int(d["suffix_len"])
    return expected_hit_rate(prompt, shared_split(prompt, float(fraction))[0], int(blocks.pop()))


def cell_run(path: Path) -> Path:
    """A cell's run folder: ``path`` itself, the newest run of a study folder, or that of the one
    study folder under a results root (``out``)."""
    path = Path(path)
    subs = [p for p in path.iterdir() if p.is_dir()] if path.is_dir() else []
    if not (path / MANIFEST).exists() and len(subs) == 1 and not any((p / MANIFEST).exists() for p in subs):
        return find_run_dir(subs[0])
    return find_run_dir(path)


def load_cells(runs: Mapping[float, Path]) -> dict[float, Cell]:
    cells = {}
    for fraction, path in runs.items():
        study = load(cell_run(path))
        if study.arms.empty:
            raise UserError(f"{study.path}: no arms.csv (a run that finished no point, or one older than it)")
        cells[fraction] = Cell(study.arms, study.summary, workload_hit_rate(study.config, study.manifest))
    return cells


def _gain(v: float, lo: float, hi: float) -> str:
    if not math.isfinite(v):
        return "–"
    return f"{100 * v:.1f} %" + (f" [{100 * lo:.1f}, {100 * hi:.1f}]" if math.isfinite(lo) else "")


def cells_table(table: pd.DataFrame) -> pd.DataFrame:
    """The report's table: one row per cell, gains in % with their intervals."""
    return pd.DataFrame({
        "shared fraction": table["shared_fraction"].map(lambda v: f"{v:g}"),
        "req/s (actual)": table["arrival_rate"].map(lambda v: f"{v:.3g}"),
        "hit rate (workload's)": [f"{h:.3f} ({w:.3f})" + ("" if ok else " OFF THE WORKLOAD'S")
                                  for h, w, ok in zip(table["hit_rate"], table["hit_rate_workload"],
                                                      table["hit_rate_ok"], strict=True)],
        "mean E2E gain": [_gain(*v) + (" (bound)" if b else "") for *v, b in
                          zip(table["gain_mean_e2e"], table["gain_mean_e2e_lo"], table["gain_mean_e2e_hi"],
                              table["gain_is_bound"], strict=True)],
        "throughput gain": [_gain(*v) for v in zip(table["gain_throughput"], table["gain_throughput_lo"],
                                                   table["gain_throughput_hi"], strict=True)],
        "pays": table["pays"].map(lambda v: "yes" if v else "no")})


def hit_rate_blocks(table: pd.DataFrame, fig) -> list[tuple]:
    pays = pays_from(table)
    arm, baseline = table["arm"].iloc[0], table["baseline"].iloc[0]
    return [("headline", pays_sentence(pays)), ("list", top_sentences(pays)),
            ("h2", "Gain against hit rate, by load"), ("fig", fig),
            ("p", f"Each cell is one run of the same prompt length at one shared fraction, {arm_label(arm)} against "
                  f"{arm_label(baseline)}. Hit rate: {arm_label(arm)}'s measured share of prompt tokens served from "
                  "cache; in brackets what the workload lets a warm cache serve, floor(min(shared, L - 1) / B)·B / L "
                  "(whole blocks of B tokens, never the prompt's last token). Mean E2E gain: (baseline - arm) / "
                  "baseline, paired by request, 95 % interval (t over repeats; one repeat: a block bootstrap of its "
                  "requests). Throughput gain: (arm - baseline) / "
                  "baseline of output tokens per second, paired by repeat, Student's t over the repeats. Where both "
                  "arms keep up with the arrivals, each finishes what is offered, so throughput gains little "
                  "whatever the hit rate; it gains where the baseline falls behind. Pays: the E2E gain's interval "
                  "above 0. hit_rate.csv holds every column."),
            ("table", cells_table(table))]


def hit_rate_report_from(runs: Mapping[float, Path], out_dir: Path, title: str = "Gain against hit rate") -> Path:
    """Write the report of the runs {shared fraction: run folder} into ``out_dir``; report.html's path."""
    table = gain_by_hit_rate(load_cells(runs))
    if table.empty:
        raise UserError(f"{out_dir}: no shared-fraction cell has a compared arm; nothing to report")
    out_dir = Path(out_dir)
    atomic_write_csv(out_dir / HIT_RATE_CSV, table)
    figs = kit.save_all([("gain_vs_hit_rate", lambda: gain_vs_hit_rate(table),
                          "The compared arm's gain over the baseline against its hit rate, one curve per rate")],
                        out_dir / "plots")
    return write_report(hit_rate_blocks(table, figs[0]), title, out_dir)


def hit_rate_report(parent: Path) -> Path:
    """The report of the shared-fraction sweep in ``parent`` (its sweep.json); report.html's path."""
    return hit_rate_report_from(read_sweep(parent), Path(parent), f"Gain against hit rate: {Path(parent).name}")
