"""Stage: output (report).  A results folder in, report.md + report.html + plots/ out.

``build_report(results_dir)`` reads the study and its summary.csv (``data.analyze``), draws
the figures (``figures``) into ``RESULTS/plots/`` as PNG and SVG, lays out the blocks
(``tables`` for the words and tables) and writes them (``render``):

* ``report.md``: figures linked from ``plots/``;
* ``report.html``: self-contained, every figure embedded as a base64 PNG.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from prefixstudy.config.arms import arm_label
from prefixstudy.errors import UserError
from prefixstudy.metrics.requests import counted, parse_slo
from prefixstudy.report import arms as arm_report, bench_import, figure_kit as kit, figures as plots, first_screen, tables
from prefixstudy.report import closure as closure_report, gain_split as split_report, machines as machine_report
from prefixstudy.report import order as order_report
from prefixstudy.report import capacity_search, prediction, saturation_codes as sat_codes, slo as slo_report
from prefixstudy.report.data import ReportData, analyze, norm_rate
from prefixstudy.report.render import FORMATS, PLOTS_DIR, SavedFigure, write_report
from prefixstudy.results import HEADLINE, MANIFEST, SUMMARY, find_run_dir, load, write_json
from prefixstudy.results.finish import finish_run
from prefixstudy.report.workloads import workload_blocks
from prefixstudy.schema import MODES

log = logging.getLogger(__name__)


def default_point(points: pd.DataFrame) -> float:
    """Highest rate at which both modes are unsaturated, else the highest rate."""
    rates = sorted(points["rate"].unique())
    if not rates:
        raise UserError("no finished points to draw")
    both = [r for r in rates
            if set(points.loc[(points["rate"] == r) & ~points["saturated"], "mode"]) >= set(points["mode"])]
    return float(both[-1]) if both else float(rates[-1])


def parse_point(text: str | None) -> tuple[str | None, float] | None:
    """``--point``: "8", "on 8", "off:8", "on=8" -> (mode or None, rate)."""
    if text is None or not str(text).strip():
        return None
    m = re.fullmatch(r"\s*(?:(on|off)\s*[:=,@ ]\s*)?([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*", str(text), re.I)
    if not m:
        raise UserError(f"--point '{text}': expected [MODE] RATE, e.g. --point 8 or --point 'on 8'")
    return (m.group(1).lower() if m.group(1) else None, float(m.group(2)))


def _timeseries_point(done: pd.DataFrame, point: tuple[str | None, float] | None,
                      arms: tuple[str, str] = MODES) -> tuple[tuple[str, ...], float]:
    """(modes, rate) of the engine time series: ``--point``'s, else ``default_point``; both
    compared arms unless ``--point`` names one."""
    mode_sel, rate = (None, default_point(done)) if point is None else point
    rates = done["rate"].to_numpy()
    if point is not None and not np.isclose(rates, rate).any():
        raise UserError(f"--point {rate:g}: no finished point at that rate; "
                        f"rates: {tables.rates_list(sorted(done['rate'].unique()))}")
    return ((mode_sel,) if mode_sel else arms), float(rates[np.argmin(np.abs(rates - rate))])


def draw_figures(d: ReportData, out_dir: Path, peers: pd.DataFrame | None = None,
                 point: tuple[str | None, float] | None = None,
                 formats: Sequence[str] = FORMATS) -> list[SavedFigure]:
    done = d.done
    a_, b_ = (arm_label(m) for m in d.arms)
    who = "Caching" if d.arms == MODES else f"{a_}'s"
    sat_rates = sorted(set(done.loc[done["saturated"], "rate"]))
    sat_map = {(m, float(r)): bool(s) for m, r, s in zip(done["mode"], done["rate"], done["saturated"], strict=True)}
    rate_map = dict(zip(d.points["nominal_rate"], d.points["rate"], strict=True))
    req_ok = counted(norm_rate(d.study.requests))
    req_ok["rate"] = [rate_map.get(r, r) for r in req_ok["rate"]]
    it = norm_rate(d.study.iterations)
    # The time series is one point's (repeat 0's) steps; --point names a configured rate.
    ts_modes, rate = _timeseries_point(done.assign(rate=done["nominal_rate"]), point, d.arms)
    it = it[it["repeat"] == 0]
    which = "chosen with --point" if point else "the highest rate at which both modes are unsaturated (else the highest)"
    # In the order the report shows them, numbered from 1 in that order.
    specs = []
    if first_screen.ran(d.head, d.arms):
        specs.append(("e2e_intervals", lambda: first_screen.e2e_with_intervals(d.head, d.arms),
                      "E2E: mean with 95 % CI, p90 dashed; hollow: saturated."))
    if arm_report.shown(d.study.arms):
        specs.append(("arms", lambda: arm_report.figure(d.study.arms),
                      "Every arm against the baseline arm: mean E2E with 95 % intervals (left) and the "
                      "paired gain of the mean (right), vs the actual arrival rate."))
    specs += [
        ("e2e_vs_rate", lambda: plots.e2e_vs_rate(done, peers),
         "Mean (solid) and p99 (dashed) end-to-end latency vs actual arrival rate."),
        ("ttft_vs_rate", lambda: plots.ttft_vs_rate(done, peers),
         "Mean (solid) and p99 (dashed) time to first token vs actual arrival rate."),
        ("latency_breakdown", lambda: plots.latency_breakdown(done),
         "Mean queue / prefill / decode time per request; the label is the request-level prefill share "
         "(mean prefill time / mean E2E of a request). It is not the engine prefill share of the Prefill "
         "share section (the share of busy engine time spent computing prompts): a request's decode time "
         "also holds the steps it shares with other requests' prefills, so the two differ under load."),
        ("max_rate_vs_threshold", lambda: plots.max_rate_vs_threshold(d.curves, d.knees),
         "Highest offered rate whose p90 E2E (left) / p90 TTFT (right) meets a threshold, "
         "vs the threshold; dotted: knee rate."),
    ]
    if has_gain(d):
        specs.append(("caching_gain", lambda: plots.caching_gain(d.gains, sat_rates),
                      f"{who} gain ({b_} − {a_}) / {b_} of mean E2E (t interval "
                      "over the repeats' paired gains) and mean TTFT (independent bootstrap), 95 % CIs."))
    if len(d.split):
        specs.append(("gain_split", lambda: split_report.figure(d.split),
                      "Where the caching gain comes from: points of the gain of mean E2E per part of a request's "
                      "latency, vs the actual arrival rate; they add up to the measured gain (black)."))
    specs += [
        ("prefill_share", lambda: plots.prefill_share(done),
         "Prefill share vs rate: request level (solid) and engine level (dashed)."),
        ("engine_timeseries", lambda: plots.engine_timeseries(
            it, rate, {m: sat_map.get((m, rate), False) for m in d.arms}, ts_modes),
         f"Engine state over time at {tables.rate_str(rate)} req/s set, first repeat ({which})."),
        ("e2e_cdf", lambda: plots.e2e_cdf(req_ok, sat_map, modes=d.arms),
         "CDF of end-to-end latency at each offered rate."),
    ]
    specs = [(stem, draw, f"Figure {i}. {caption}") for i, (stem, draw, caption) in enumerate(specs, 1)]
    return kit.save_all(specs, out_dir / PLOTS_DIR, formats)


def model_section(d: ReportData) -> tuple[list[str], pd.DataFrame | None]:
    """The performance model's predictions against the measurement, for a GPU the model knows."""
    device = str(d.study.manifest.get("device") or (d.study.config or {}).get("device") or "")
    try:
        from prefixstudy.costmodel import gpus
        known = gpus.find_gpu(device) is not None if device else False
    except (ImportError, AttributeError):
        known = False
    if not known:
        return [], None
    try:
        from prefixstudy.model.calibrate import model_vs_measurement
    except (ImportError, AttributeError):
        return [f"Device {device} is a known GPU, but prefixstudy.model.model_vs_measurement is not available."], None
    # The model matches points to requests by the configured rate, not the actual one the tables show.
    points = d.points.assign(rate=d.points["nominal_rate"])
    try:
        df = model_vs_measurement(points, norm_rate(d.study.requests), norm_rate(d.study.iterations),
                                  d.study.config, device)
    except UserError as e:  # the study lacks what the model needs: say what, in words
        return [f"The first-principles model (prefixstudy.model) could not be calibrated on this study: {e}."], None
    except Exception as e:  # noqa: BLE001 - the model is someone else's stage: report, don't crash the report
        return [f"The first-principles model (prefixstudy.model) could not be evaluated on {device} "
                f"({e.__class__.__name__}: {e})."], None
    if df is None or len(df) == 0:
        return [f"The performance model has no prediction for {device}."], None
    return [f"First-principles model (prefixstudy.model) for {device} against the measurement."], df


def _model_blocks(model: tuple[list[str], pd.DataFrame | None]) -> list[tuple]:
    texts, df = model
    if not texts and df is None:
        return []
    return ([("h2", "Model vs measurement")] + [("p", t) for t in texts]
            + ([("table", tables.fmt_df(df))] if df is not None else []))


def _order_blocks(d: ReportData) -> list[tuple]:
    t = order_report.table(d.study)
    return [("h2", "Arm order"), ("p", order_report.TEXT), ("table", t)] if len(t) else []


def _fit_kind_blocks(d: ReportData) -> list[tuple]:
    t = tables.fit_kind_table(d)
    return [("p", tables.FIT_KIND_TEXT), ("table", t)] if len(t) else []


def _closure_blocks(d: ReportData) -> list[tuple]:
    t, phys = closure_report.table(d), closure_report.physics_table(d)
    out = [("h2", "A model that closes the loop"), ("p", closure_report.TEXT), ("table", t)] if len(t) else []
    return out + ([("p", closure_report.PHYSICS_TEXT), ("table", phys)] if len(phys) else [])


def has_gain(d: ReportData) -> bool:
    """Whether the study measured the arm's gain over its baseline at some rate (both ran)."""
    return bool(len(d.gains)) and bool(pd.to_numeric(d.gains["gain"], errors="coerce").notna().any())


def first_screen_blocks(d: ReportData, f: dict[str, SavedFigure], lead: list[str]) -> list[tuple]:
    """Before the first section: at most four findings, then the E2E figure beside one compact table."""
    b: list[tuple] = []
    said = first_screen.findings(d.head, d.arms, d.headline, lead) if len(d.head) else list(lead)
    if said:
        b.append(("list", said, "findings"))
    if "e2e_intervals" in f:
        t = first_screen.compact_table(d.head, d.study.summary, d.arms)
        b.append(("row", [[("fig", f["e2e_intervals"])],
                          [("table", t), ("p", first_screen.compact_legend(t, d.head, d.arms))]], "first-screen"))
    return b


def _arm_blocks(d: ReportData, f: dict[str, SavedFigure]) -> list[tuple]:
    b: list[tuple] = []
    if len(d.tiers):
        b += [("p", t) for t in arm_report.tier_sentences(d.tiers, arm_report.tier_sizes(d.study.config))]
    if arm_report.shown(d.study.arms):
        b += [("p", t) for t in arm_report.sentences(d.study.arms)]
        b += [("table", arm_report.table(d.study.arms)), ("fig", f["arms"])]
    return [("h2", "Arms"), *b] if b else []


def _per_rate_blocks(d: ReportData) -> list[tuple]:
    b: list[tuple] = [("h2", "Per rate")]
    if len(d.head):
        b += [("p", t) for t in first_screen.why_sentences(d.head, d.arms,
                                                            first_screen.no_share_reason(d.study.manifest))]
        b.append(("table", first_screen.headline_table(d.head, d.arms)))
    b += machine_report.blocks(d.head, d.study.summary, d.arms)  # repeats on several machines
    b += [("p", t) for t in tables.headline_paragraphs(d)]
    if d.slo:
        b.append(("p", "SLOs (ms): " + ", ".join(f"{k} ≤ {v:g}" for k, v in d.slo.items())
                  + ". Goodput = counted requests meeting every SLO / point duration (summary.csv's duration_s)."))
    return b


def _saturation_blocks(d: ReportData) -> list[tuple]:
    t = sat_codes.reasons_table(d.study.summary)
    if not len(t):
        return [("h2", "Saturation"), ("p", "No repeat of any point saturated.")]
    return [("h2", "Saturation"),
            ("p", "Every saturated repeat, with the rules that fired (summary.csv's saturation_reason). "
                  "The tables above give each rule a code:"),
            ("list", [f"{c}: {text}" for c, text in sat_codes.LEGEND.items() if c != sat_codes.OTHER]),
            ("table", t)]


def report_blocks(d: ReportData, figs: list[SavedFigure], model: tuple[list[str], pd.DataFrame | None],
                  run_notes: Sequence[tuple] = ()) -> list[tuple]:
    """Every block of the report: the first screen (no section), then the sections.  ``run_notes``:
    blocks the Run section adds (peers overlaid, their warnings)."""
    f = {x.stem: x for x in figs}
    a_, b_ = (arm_label(m) for m in d.arms)
    said = prediction.of_run(d.study.manifest, d.study.path)  # a simulation's error, before any number
    b = first_screen_blocks(d, f, said[:1])
    b += slo_report.blocks(d.study.manifest, d.study.summary, d.head, d.arms)  # an SLO search's answer
    b += capacity_search.blocks(d.study.path)  # a capacity search's answer
    if said[1:]:
        b += [("h2", "Prediction error"), *(("p", t) for t in said[1:])]
    b += _arm_blocks(d, f)
    b += [("h2", "Run"), ("meta", tables.meta_line(d.study)), *run_notes]
    b += _per_rate_blocks(d)
    b += _saturation_blocks(d)
    b += [("h2", "Points"),
          ("p", f"Every point of the run. {tables.SAT_MARK} marks a saturated point in every table; "
                "an X marks one in every figure."),
          ("table", tables.all_points_table(d)),
          ("table", tables.points_table(d)),
          ("h2", "Latency vs load"), ("fig", f["e2e_vs_rate"]), ("fig", f["ttft_vs_rate"]),
          ("h2", "Where the time goes"), ("fig", f["latency_breakdown"]),
          ("h2", "Highest rate meeting a latency threshold"), ("fig", f["max_rate_vs_threshold"])]
    if has_gain(d):
        b += [("h2", "Caching gain"),
              ("p", f"E2E gain = ({b_} − {a_}) / {b_} of the mean over requests counted in both modes; its 95 % CI "
                    f"resamples repeats, then blocks of consecutive request indices, the same blocks in {a_} and {b_} "
                    "(metrics.headline). TTFT gain: 1000 seeded bootstrap resamples of each mode independently. "
                    f"Paired Δ = {b_} − {a_} of the same request (repeat and request_index) at the same rate; > 0 "
                    f"means {a_} was faster."),
              ("fig", f["caching_gain"]), ("table", tables.gain_table(d))]
    if len(d.split):
        b += [("h2", "Where the gain comes from"), ("p", split_report.TEXT.format(arm=a_, baseline=b_)),
              ("fig", f["gain_split"]), ("table", split_report.table(d.split))]
    b += [*_order_blocks(d),
          *_closure_blocks(d),
          ("h2", "Prefill share"), ("p", tables.ESTIMATOR_TEXT), ("table", tables.fit_table(d)),
          *_fit_kind_blocks(d),
          ("fig", f["prefill_share"]), ("table", tables.prefill_table(d)),
          ("h2", "Step-timing checks"), ("p", tables.STEP_CHECKS_TEXT), ("list", tables.step_check_lines(d.step_checks)),
          ("h2", "Engine time series"), ("fig", f["engine_timeseries"]),
          ("h2", "Latency distributions"), ("fig", f["e2e_cdf"]),
          ("h2", "Definitions"), ("p", tables.SATURATION_TEXT), ("p", tables.COUNTED_TEXT),
          ("p", tables.INTERVAL_TEXT)]
    b += _model_blocks(model)
    if d.notes:
        b += [("h2", "Notes"), ("list", d.notes)]
    return b


def build_report(results_dir: str | Path, slo: dict[str, float] | str | None = None,
                 threshold_ms: float | None = None, peers: Sequence[str | Path] = (),
                 point: str | tuple[str | None, float] | None = None, *, n_boot: int = 1000,
                 seed: int = 0, formats: Sequence[str] = FORMATS) -> Path:
    """Write report.md, report.html and plots/ into the run folder.  Returns report.html's path.

    ``slo``: dict (ms) or text "ttft=200,e2e=2000".  ``threshold_ms``: the p90 E2E threshold
    of the headline (default: the e2e SLO, else 2 × OFF's p90 E2E at the lowest rate).
    ``peers``: vllm-bench-serve JSON files overlaid on the E2E and TTFT figures.  ``point``: the
    rate (optionally "MODE RATE") of the engine time series.
    """
    run = find_run_dir(Path(results_dir))
    head = run / HEADLINE
    summary = run / SUMMARY
    if not head.is_file() or (summary.is_file() and head.stat().st_mtime < summary.stat().st_mtime):
        # A run cut short before its end (or resumed since), or older than headline.csv.
        manifest = load(run).manifest
        finish_run(run, manifest)
        write_json(run / MANIFEST, manifest)
    study = load(run)
    kit.register_arms(((study.config.get("sweep") or {}).get("modes")) or kit.MODES)
    slo = parse_slo(slo) if isinstance(slo, str) or slo is None else dict(slo)
    slo = slo or dict(study.config.get("goodput") or {})  # the run's --goodput, unless one is given here
    point = parse_point(point) if isinstance(point, str) or point is None else point
    if study.requests.empty:
        raise UserError(f"{study.path}: no requests recorded yet; nothing to report")
    peer_df = bench_import.peer_points(list(peers)) if peers else None
    d = analyze(study, slo, threshold_ms, n_boot=n_boot, seed=seed)
    if d.done.empty:  # every point failed (a server answering errors): say so, with each point's error
        blocks = [("meta", tables.meta_line(d.study)), *(("headline", t) for t in tables.headline_paragraphs(d)),
                  ("h2", "Points"), ("p", "No point finished, so there is nothing to draw."),
                  ("table", tables.all_points_table(d))]
        return write_report(blocks, f"Prefix caching study: {d.label}", study.path)
    figs = draw_figures(d, study.path, peer_df, point, formats)
    notes: list[tuple] = []
    if peers:
        shown = [x.caption.split(".")[0] for x in figs if x.stem in ("e2e_vs_rate", "ttft_vs_rate")]
        notes.append(("p", f"Peer measurements overlaid on {' and '.join(shown).lower()}: "
                      + ", ".join(str(p) for p in peers) + "."))
        warm = bench_import.warm_peers(peer_df, float(d.study.summary["hit_rate_expected"].max()),
                                       float((d.study.config.get("checks") or {}).get("hit_rate_tolerance", 0.05)))
        for w in warm:
            log.warning("warning: %s", w)
        if warm:
            notes.append(("list", warm))
    blocks = report_blocks(d, figs, model_section(d), notes) + workload_blocks(study)
    return write_report(blocks, f"Prefix caching study: {d.label}", study.path)
