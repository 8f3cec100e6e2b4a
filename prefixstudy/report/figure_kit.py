"""The pieces every report figure is built from: the arms' colours and labels, the markers, a
new figure on the Agg canvas, saving, and the line, legend and rate-axis helpers.

Figures are built on the Agg canvas without pyplot, so nothing global is kept; ``save`` writes
PNG and SVG and closes the figure.  Conventions in every figure: caching ON is tab:blue, OFF is
tab:orange, other arms take ``ARM_PALETTE`` in the study's order, and a saturated point is drawn
as a large ``X`` (``SAT_MARKER``) instead of a dot.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from pathlib import Path

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")  # no display, ever; harmless if already Agg

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

from prefixstudy.report.render import SavedFigure  # noqa: E402
from prefixstudy.results.store import atomic_write_bytes  # noqa: E402

# Arms beyond on / off take these in the order the study names them (register_arms), so an arm
# keeps its colour in every figure of a report.
ARM_PALETTE = ("tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:olive", "tab:cyan", "tab:gray")


class _ArmColors(dict):
    def __missing__(self, arm: str) -> str:
        self[arm] = ARM_PALETTE[(len(self) - 2) % len(ARM_PALETTE)]
        return self[arm]


class _ArmLabels(dict):
    def __missing__(self, arm: str) -> str:
        return f"arm {arm}"


MODE_COLORS = _ArmColors({"on": "tab:blue", "off": "tab:orange"})
MODE_LABELS = _ArmLabels({"on": "caching ON", "off": "caching OFF"})
MODES = ("on", "off")


def register_arms(arms: Sequence[str]) -> None:
    """Give a study's arms their colours in its own order (on and off keep blue and orange), so
    the same config draws every arm in the same colour, in every figure and every report."""
    for a in [k for k in MODE_COLORS if k not in MODES]:
        del MODE_COLORS[a]
    for a in arms:
        MODE_COLORS[a]  # noqa: B018 (assigns on first sight)


def arms_in(df: pd.DataFrame) -> list[str]:
    """The arms of a frame with a ``mode`` column: on, off, then the others as they first appear."""
    seen = list(dict.fromkeys(df["mode"])) if "mode" in df else []
    return [m for m in MODES if m in seen] + [m for m in seen if m not in MODES]


DOT = "o"
SAT_MARKER = "X"
SAT_SIZE = 11
PEER_COLORS = ("tab:gray", "tab:brown", "tab:olive", "tab:cyan", "tab:pink")
STUDY_STYLES = (("-", "o"), ("--", "s"), (":", "^"), ("-.", "D"), ((0, (5, 1)), "v"))
GAIN_COLORS = {"e2e_ms": "tab:green", "ttft_ms": "tab:purple"}
CDF_CMAPS = {"on": "Blues", "off": "Oranges", 0: "Greens", 1: "Purples"}  # other arms: by their panel


def rate_str(r: float) -> str:
    """A rate as a reader wants it: 16, 0.5, 12.71 (two decimals at most)."""
    return f"{r:.2f}".rstrip("0").rstrip(".") if math.isfinite(r) else "–"


def save_all(specs, plots_dir: Path, formats: Sequence[str] = ("png", "svg")) -> list[SavedFigure]:
    """Draw and save every (stem, make, caption) of ``specs`` under ``plots_dir``."""
    return [SavedFigure(stem, caption, save(make(), plots_dir / stem, formats)) for stem, make, caption in specs]


def new_figure(width: float = 8.0, height: float = 5.0) -> Figure:
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def save(fig: Figure, stem: Path, formats: Sequence[str] = ("png", "svg"), dpi: int = 100) -> list[Path]:
    """Write ``stem.<fmt>`` for every format, then close the figure.  Returns the paths.  Each file
    is rendered in memory and replaced whole, so a full disk leaves the last good figure, never a
    truncated one."""
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    out = []
    try:
        for fmt in formats:
            p = stem.with_suffix(f".{fmt}")
            buf = io.BytesIO()
            with matplotlib.rc_context({"svg.hashsalt": stem.name}):  # the SVG's element ids: the same every time
                fig.savefig(buf, format=fmt, dpi=dpi, metadata=_no_date(fmt))
            atomic_write_bytes(p, buf.getvalue())
            out.append(p)
            # The first draw placed every axis; the next formats draw that layout, not a new one
            # (constrained layout is a third of a figure's time; the SVG's axes move by under a pixel).
            fig.set_layout_engine("none")
    finally:
        close(fig)
    return out


def close(fig: Figure) -> None:
    """Release the figure's artists (there is no pyplot registry to leave)."""
    fig.clear()


def _no_date(fmt: str) -> dict:
    # Reproducible files: no creation date in the SVG/PNG metadata.
    return {"Date": None} if fmt == "svg" else {}


def _sat(df: pd.DataFrame) -> np.ndarray:
    if "saturated" not in df:
        return np.zeros(len(df), dtype=bool)
    return df["saturated"].fillna(False).astype(bool).to_numpy()


def mode_line(ax, points: pd.DataFrame, mode: str, col: str, *, ls="-", label=None,
               color=None, dot=DOT) -> None:
    p = points[points["mode"] == mode].sort_values("rate")
    if p.empty or col not in p:
        return
    color = color or MODE_COLORS[mode]
    x, y = p["rate"].to_numpy(float), p[col].to_numpy(float)
    sat = _sat(p)
    ax.plot(x, y, ls=ls, color=color, label=label)
    ax.plot(x[~sat], y[~sat], ls="none", marker=dot, color=color, ms=5)
    ax.plot(x[sat], y[sat], ls="none", marker=SAT_MARKER, color=color, ms=SAT_SIZE,
            markeredgecolor="black", markeredgewidth=0.8)


def sat_handle() -> Line2D:
    return Line2D([], [], ls="none", marker=SAT_MARKER, color="white", markeredgecolor="black",
                  ms=SAT_SIZE, label="saturated point")


def legend(ax, extra: Sequence = (), **kw) -> None:
    handles, labels = ax.get_legend_handles_labels()
    handles += list(extra)
    labels += [h.get_label() for h in extra]
    ax.legend(handles, labels, fontsize=8, **kw)


def rate_axis(ax, rates=None) -> None:
    """Label the rate axis; a sweep spanning 8x or more gets a log2 axis with plain numbers."""
    ax.set_xlabel("offered request rate (req/s)")
    ax.grid(True, which="both", alpha=0.3)
    r = np.asarray([] if rates is None else rates, dtype=float)
    r = r[np.isfinite(r) & (r > 0)]
    if r.size and r.max() / r.min() >= 8:
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
