"""The report's "Where the gain comes from": metrics.gain_split as a figure, a table and a sentence.

Both measures of the stalls (fitted, model-free) side by side, each part with its 95 % interval over
the repeats.  Where the two measures of a part differ by ``DISAGREE`` or more, the choice of measure
moves it more than a tenth can say: both are shown in whole points (``precision``'s rules otherwise).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from prefixstudy.metrics.gain_split import MEASURES, PARTS
from prefixstudy.report import figure_kit as kit
from prefixstudy.report.precision import with_ci

DISAGREE = 0.01  # one point of the gain
SHOWN = ("prefill_stalls", "own_prefill", "decode_steps", "queue", "unpriced", "residual")
LABELS = {"queue": "queueing", "own_prefill": "its own prefill", "prefill_stalls": "other requests' prompt chunks "
          "in its decode steps", "decode_steps": "decode steps (batch size, step overhead)", "unpriced": "unpriced",
          "residual": "residual"}
COLORS = {"queue": "#8c564b", "own_prefill": "#2ca02c", "prefill_stalls": "#d62728", "decode_steps": "#9467bd",
          "unpriced": "#bcbd22", "residual": "#7f7f7f"}
# {arm} and {baseline}: the arm compared and its baseline (ON and OFF by default), filled in by the report.
TEXT = ("Each counted request's E2E split on the clocks that measured it (metrics.gain_split): the engine's "
        "queue stamp; the rest of its TTFT (its own prefill); and the engine steps that ended between its first "
        "and last token, split into what other requests' prompt chunks added to them and the rest (decode steps). "
        "Two measures price the prompt chunks: the step-cost fit (fitted), and each step's excess over the median "
        "decode-only step of the same decode batch size in the same run (model-free, metrics.step_excess). Steps "
        "the model-free measure cannot price (no decode-only step of a size near theirs) are unpriced. The residual "
        "is what no step it rode in holds. Points of the gain = ({baseline} − {arm}) / {baseline} mean E2E of each "
        "part, over the requests counted in both; they add up to the gain of mean E2E. Brackets: 95 % intervals, "
        "Student's t over the repeats. Where the two measures differ by a point or more, both are in whole points. "
        "A saturated point's parts are bounds, as its latency is.")


def figure(split: pd.DataFrame) -> Figure:
    """Stacked points of the gain per part against the actual arrival rate (negative parts below 0), a bar
    per measure (model-free hatched), the measured gain as a line over them."""
    fig = kit.new_figure(10.0, 4.5)
    ax = fig.add_subplot(111)
    rates = sorted(split["rate"].unique())
    x = np.arange(len(rates))
    measures = [m for m in MEASURES if (split["measure"] == m).any()]
    width = 0.8 / len(measures)
    for k, m in enumerate(measures):
        s = split[split["measure"] == m].set_index("rate").reindex(rates)
        at = x + (k - (len(measures) - 1) / 2) * width
        pos, neg = np.zeros(len(rates)), np.zeros(len(rates))
        for p in PARTS:
            v = np.nan_to_num(100 * s[f"{p}_points"].to_numpy(float))
            ax.bar(at, v, bottom=np.where(v >= 0, pos, neg), color=COLORS[p], width=width * 0.9,
                   hatch="//" if m == "model-free" else None, label=LABELS[p] if k == 0 else None)
            pos, neg = pos + np.maximum(v, 0), neg + np.minimum(v, 0)
    gain = split.groupby("rate")["gain"].first().reindex(rates)
    ax.plot(x, 100 * gain.to_numpy(float), "k.-", label="gain of mean E2E (measured)")
    if len(measures) > 1:
        ax.bar([0], [0], color="white", edgecolor="k", hatch="//", label="right bar: model-free; left: fitted")
    ax.set_xticks(x, [kit.rate_str(r) for r in rates])
    ax.set_xlabel("actual arrival rate (req/s)")
    ax.set_ylabel("points of the caching gain (%)")
    ax.axhline(0, color="k", lw=0.5)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # outside: constrained layout makes room
    return fig


def cells(split: pd.DataFrame, parts=SHOWN) -> pd.DataFrame:
    """One row per rate and measure: ``gain`` and each of ``parts`` as "v [lo, hi]" in points, at the
    precision its interval supports, in whole points where the measures differ by ``DISAGREE`` or more."""
    rows = []
    for rate, by_rate in split.groupby("rate", sort=True):
        g = by_rate.set_index("measure")
        for m, r in g.iterrows():
            row = {"rate": rate, "measure": m, "gain": with_ci(r["gain"], r["gain_lo"], r["gain_hi"], scale=100)}
            for p in parts:
                c = f"{p}_points"
                apart = (g[c].max() - g[c].min()) >= DISAGREE
                row[p] = with_ci(r[c], r[f"{c}_lo"], r[f"{c}_hi"], scale=100, most=0 if apart else 1)
            if "unpriced" in parts and r.get("broken_series", 0) > 0:  # metrics.step_excess's invariant
                row["unpriced"] += f" ({int(r['broken_series'])} runs' mixed steps shorter than decode-only)"
            rows.append(row)
    return pd.DataFrame(rows, columns=["rate", "measure", "gain", *parts])


def table(split: pd.DataFrame) -> pd.DataFrame:
    c = cells(split)
    out = pd.DataFrame({"rate (req/s)": [kit.rate_str(r) for r in c["rate"]], "measure": c["measure"],
                        "gain, mean E2E (%)": c["gain"]})
    for p in SHOWN:
        out[LABELS[p]] = c[p]
    return out

