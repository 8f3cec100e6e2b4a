"""Report of a capacity sweep (``prefixstudy capacity``, or sweeps joined by ``prefixstudy merge``):
``capacity.csv``, ``capacity.md`` (the per-point table and the collapse in words) and
``capacity.png`` / ``.svg``: the compared arm's hit rate (ON's by default) and the E2E gain over the
baseline against the capacity ratio, one line per rate.  The ratio is the blocks cached between two
uses ÷ capacity where the sweep recorded it."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from prefixstudy.config.arms import arm_label
from prefixstudy.sweep.capacity_axis import TABLE, capacity_table, collapse_lines, ratio_column, sweep_arms
from prefixstudy.metrics.breakdown import markdown
from prefixstudy.report.figure_kit import new_figure, save

COLUMNS = ["capacity", "policy", "num_blocks", "working_set_ratio", "reuse_footprint_ratio", "mode", "rate", "repeat",
           "hit_rate_measured", "hit_rate_estimated", "hit_rate_expected", "mean_e2e_ms", "e2e_gain", "saturated"]


def capacity_figure(table: pd.DataFrame, arms: tuple[str, str | None] = ("on", "off")):
    """Two panels over the capacity ratio, means over repeats: the arm's measured hit rate (dashed:
    the infinite-cache bound) and its E2E gain over the baseline; one line per rate (and routing
    policy, where the sweep ran several)."""
    x, label = ratio_column(table)
    on = table[table["mode"] == arms[0]]
    lines = ["policy", "rate"] if "policy" in on else ["rate"]
    means = on.groupby([*lines, "capacity"], sort=True)[[x, "hit_rate_measured", "hit_rate_expected", "e2e_gain"]].mean()
    fig = new_figure(10, 4.2)
    hit, gain = fig.subplots(1, 2)
    for key, grp in means.groupby(level=lines):
        *policy, rate = key
        g, name = grp.sort_values(x), f"{rate:g} req/s" + "".join(f" ({p})" for p in policy)
        hit.plot(g[x], g["hit_rate_measured"], marker="o", label=name)
        gain.plot(g[x], 100 * g["e2e_gain"], marker="o", label=name)
    bound = means.groupby(level="capacity").agg({x: "mean", "hit_rate_expected": "mean"}).sort_values(x)
    hit.plot(bound[x], bound["hit_rate_expected"], ls="--", color="gray", label="infinite cache")
    for ax, title in ((hit, f"{arm_label(arms[0])}'s prefix hit rate"),
                      (gain, f"E2E gain over {arm_label(arms[1] or 'off')} (%)")):
        ax.axvline(1.0, color="gray", lw=0.8, ls=":")
        ax.set_xlabel(label)
        ax.set_title(title)
        ax.grid(alpha=0.3)
    hit.set_ylim(bottom=0)
    hit.legend(fontsize=8)
    return fig


def write_capacity_report(parent: Path) -> pd.DataFrame:
    """Writes capacity.csv, capacity.md and capacity.png/.svg into ``parent``; returns the table."""
    table = capacity_table(parent)
    table.to_csv(parent / TABLE, index=False)  # capacity_table's columns are CAPACITY_FIELDS
    cols = [c for c in COLUMNS if c in table]
    arms = sweep_arms(parent)
    lines = collapse_lines(table, arm=arms[0])
    (parent / "capacity.md").write_text(markdown(table[cols]) + "\n\n" + "\n".join(f"- {s}" for s in lines) + "\n")
    if (table["mode"] == arms[0]).any():
        save(capacity_figure(table, arms), parent / "capacity")
    return table
