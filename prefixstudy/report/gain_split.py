"""The report's "Where the gain comes from": metrics.gain_split as a figure, a table and a sentence."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from prefixstudy.metrics.gain_split import PARTS
from prefixstudy.report import figure_kit as kit

LABELS = {"queue": "queueing", "own_prefill": "its own prefill", "prefill_stalls": "other requests' prefills in its "
          "decode steps", "decode_steps": "decode steps (batch size, step overhead)", "residual": "residual"}
COLORS = {"queue": "#8c564b", "own_prefill": "#2ca02c", "prefill_stalls": "#d62728", "decode_steps": "#9467bd",
          "residual": "#7f7f7f"}
# {arm} and {baseline}: the arm compared and its baseline (ON and OFF by default), filled in by the report.
TEXT = ("Each counted request's E2E split on the clocks that measured it (metrics.gain_split): the engine's "
        "queue stamp; the rest of its TTFT (its own prefill); and the engine steps that ended between its first "
        "and last token, priced by the step-cost fit into the prompt work other requests computed in them "
        "(prefill stalls) and the rest (decode steps). The residual is what no step it rode in holds. Points of "
        "the gain = ({baseline} − {arm}) / {baseline} mean E2E of each part; they add up to the gain of mean E2E. "
        "A saturated point's parts are bounds, as its latency is.")


def figure(split: pd.DataFrame) -> Figure:
    """Stacked points of the gain per part against the actual arrival rate (negative parts below 0),
    the measured gain as a line over them."""
    fig = kit.new_figure(10.0, 4.5)
    ax = fig.add_subplot(111)
    x = np.arange(len(split))
    pos, neg = np.zeros(len(split)), np.zeros(len(split))
    for p in PARTS:
        v = 100 * split[f"{p}_points"].to_numpy(float)
        base = np.where(v >= 0, pos, neg)
        ax.bar(x, v, bottom=base, color=COLORS[p], label=LABELS[p], width=0.6)
        pos, neg = pos + np.maximum(v, 0), neg + np.minimum(v, 0)
    ax.plot(x, 100 * split["gain"].to_numpy(float), "k.-", label="gain of mean E2E (measured)")
    ax.set_xticks(x, [kit.rate_str(r) for r in split["rate"]])
    ax.set_xlabel("actual arrival rate (req/s)")
    ax.set_ylabel("points of the caching gain (%)")
    ax.axhline(0, color="k", lw=0.5)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # outside: constrained layout makes room
    return fig


def table(split: pd.DataFrame) -> pd.DataFrame:
    out = pd.DataFrame({"rate (req/s)": [kit.rate_str(r) for r in split["rate"]],
                        "gain, mean E2E": [f"{100 * g:.1f} %" for g in split["gain"]]})
    for p in PARTS:
        out[LABELS[p]] = [f"{100 * v:+.1f}" for v in split[f"{p}_points"]]
    return out

