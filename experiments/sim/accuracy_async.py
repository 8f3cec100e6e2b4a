"""The simulator on vLLM's default engine (async scheduling), held out, on the committed studies.

    PYTHONPATH=. python experiments/sim/accuracy_async.py [--out experiments/results/sim-accuracy]

The calibrations are the committed studies that ran the default engine with GPU-span step records
(``calibrations()``: step_ms the GPU span, host_step_ms the host stamps of the same steps).  Each
one is fitted as ``prefixstudy simulate --calibration`` fits it (the async model: GPU part on the
spans, host part on the host stamps, a step costs the larger) and checked two ways:

* **point held out**: each (mode, rate) predicted from a fit on the study's other points (all of its
  repeats left out), each repeat simulated on its own arrival schedule;
* **repeat held out**: each repeat k of every point predicted from a fit on the other repeats.

Then **another run** and **another workload**: the fit on all of the calibration simulates every point
of ``OTHER_RUNS`` (the same workload, another run) and ``other_workloads()`` (the cache-pressure sweeps
and the multi-turn sessions: default-engine studies with host stamps only, of other workloads, each
with its own block count).

Writes async.csv (one row per point, repeat and check), async.md (per point: means over repeats and
errors; "cost model's period err" is the priced steps against the measured engine loop's time on
the real steps: the host records, which tile it), async-summary.md (the table in docs/simulator.md)
and async-verifiable.md (``verifiable``: at which held-out points the repeats pin the measured mean
closely enough to tell a 5 % error from none).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.dataset as ds

sys.path.insert(0, str(Path(__file__).parent))
from accuracy import _pct, knee_step, measured_half_width, per_point, simulate_points, table, verified  # noqa: E402

from prefixstudy.costmodel.step_cost import async_recorded, busy_steps, fit, load_steps, previous_gpu_ms  # noqa: E402

RESULTS = Path("experiments/results")
# Other default-engine runs of the same workload, priced by the calibration fitted on all of its
# steps: h200-tp1-fixed-order (six rates, the same day), h200-tp1-async (1 and 16 req/s, host
# stamps only, another day) and h200-tp1-slo (the rates an SLO search probed, another day); and for
# h200-multiturn-spans, h200-multiturn (the same sessions on two H200s of another lease, host stamps only);
# for the two cache-pressure cells re-run with GPU-timed steps, the same cells of the sweeps (another
# lease, host stamps only); for h100-tp1-spans, h100-tp1 (the same config on another H100 the same
# day, through Ray: one arm after the other, host stamps only) and h100-tp1-capacity (a capacity
# search of the same config on another H100, another day).
OTHER_RUNS = {"h200-tp1": ["h200-tp1-fixed-order", "h200-tp1-async", "h200-tp1-slo"],
              "h100-tp1-spans": ["h100-tp1", "h100-tp1-capacity"],
              "h200-multiturn-spans": ["h200-multiturn"],
              "h200-cache-pressure-spans": ["h200-cache-pressure/groups-48/blocks-6400"],
              "h200-cache-pressure-spans-4400": ["h200-cache-pressure/groups-40/blocks-4400"]}
CHECKS = ("held-out point", "held-out repeat", "another run", "another workload")
TOLERANCE = 0.05  # the goal: E2E within 5 % of the measured mean
WORKLOAD_CALIBRATION = "h200-tp1"


def other_workloads(results: Path = RESULTS) -> list[str]:
    """Default-engine studies of other workloads: the H200 cache-pressure sweeps (async scheduling at
    vLLM's default, their steps stamped on the host) and two of their cells re-run with every step timed
    on the GPU (h200-cache-pressure-spans: 48 groups, 6400 blocks; -4400: 40 groups, 4400 blocks), the
    multi-turn sessions (h200-multiturn, and
    h200-multiturn-spans with its steps timed on the GPU; the one-step-at-a-time twin
    h200-multiturn-sync is not the default engine) and the shared-fraction cells (h200-tp1's lengths,
    a hit rate of their own)."""
    def key(d: Path) -> tuple:
        return (d.parent.name, float(d.name.split("-")[1]))

    sweeps = sorted(results.glob("h200-cache-pressure/groups-*/blocks-*"), key=key)
    shared = sorted(results.glob("h200-shared-fraction/shared_fraction-*"), key=key)
    return [str(d.relative_to(results)) for d in sweeps] + \
        ["h200-cache-pressure-spans", "h200-cache-pressure-spans-4400", "h200-multiturn", "h200-multiturn-spans"] + \
        [str(d.relative_to(results)) for d in shared]


def calibrations(results: Path = RESULTS, spans: list[str] | None = None) -> list[str]:
    """The committed studies that calibrate the async model and are held out against themselves:
    vLLM's default engine with GPU-span steps (``gpu_span_studies``), at least two repeats of every
    point (the held-out repeat needs them).  The others are checked as another run or workload.
    ``spans``: ``gpu_span_studies(results)``, where the caller has it."""
    out = []
    for name in gpu_span_studies(results) if spans is None else spans:
        points = pd.read_csv(results / name / "summary.csv").groupby(["mode", "rate"]).size()
        if points.min() >= 2:
            out.append(name)
    return out


def gpu_span_studies(results: Path = RESULTS) -> list[str]:
    """The committed studies that ran vLLM's default engine (async scheduling, as the study recorded
    it), every step timed on the GPU with host stamps beside."""
    out = []
    for path in sorted(results.rglob("iterations.parquet")):
        data = ds.dataset(path)
        if "timing" not in data.schema.names or "host_step_ms" not in data.schema.names:
            continue
        timing = data.to_table(columns=["timing"]).column("timing").to_pandas()
        if len(timing) and (timing == "gpu-span").all() and async_recorded(path.parent, timing.to_frame()):
            out.append(str(path.parent.relative_to(results)))
    return out


def _fit(steps: pd.DataFrame, source: str):
    return fit(steps, source=source, async_scheduling=True)


def held_out_point(d: Path) -> list[dict]:
    steps = load_steps(d)

    def cost(mode, rate):
        return _fit(steps[(steps["mode"] != mode) | (steps["rate"] != rate)], f"{d} without {mode} {rate:g}")

    return simulate_points(d, cost, "held-out point")


def held_out_repeat(d: Path) -> list[dict]:
    steps = load_steps(d)
    out = []
    for k in sorted(steps["repeat"].unique()):
        model = _fit(steps[steps["repeat"] != k], f"{d} without repeat {k}")
        out += simulate_points(d, lambda mode, rate, m=model: m, "held-out repeat", repeats={int(k)})
    return out


def another_run(src: Path, dst: Path, check: str = "another run") -> list[dict]:
    model = _fit(load_steps(src), str(src))
    return [{**r, "study": str(dst.relative_to(RESULTS)), "calibration": src.name}
            for r in simulate_points(dst, lambda mode, rate: model, check)]


def period_error(model, steps: pd.DataFrame) -> float:
    """The priced steps' sum against the engine loop's measured time over the same real steps:
    the host records (host_step_ms where the GPU timed the steps, step_ms where it did not).  Where
    the host part launches each step while the one before runs (``CostModel.host_overlaps``), a step
    spans max(the step before's price, its launch) + its price - the step before's, from the step
    before's output to its own, as a host record does."""
    b = busy_steps(steps) if (steps["timing"] == "gpu-span").all() else \
        steps[(steps["step_ms"] > 0) & (steps["prefill_tokens"] + steps["decode_tokens"] > 0)]
    y = b["host_step_ms"] if "host_step_ms" in b and b["host_step_ms"].notna().all() else b["step_ms"]
    terms = ["prefill_tokens", "num_prefill_reqs", "decode_tokens", "context_tokens"] + \
        (["kv_tokens"] if "kv_tokens" in b else [])  # the kv forms' steps carry it
    if getattr(model, "host_overlaps", False):
        b = b.assign(prefix_queries=b["prefix_queries"] if "prefix_queries" in b else 0)
        rows = list(b[terms + ["prefix_queries"]].itertuples(index=False))
        priced = np.array([model(f) for f in rows])
        before = previous_gpu_ms(b.assign(step_ms=priced))
        priced = np.maximum(before, [model.launch_ms(f) for f in rows]) + priced - before
    else:
        priced = np.array([model(f) for f in b[terms].itertuples(index=False)])
    return float(priced.sum() / y.to_numpy(dtype=float).sum() - 1)


def add_cost_error(df: pd.DataFrame) -> pd.DataFrame:
    steps_of, fits, out = {}, {}, []
    for _, r in df.iterrows():
        study = r["study"]
        steps = steps_of.setdefault(study, load_steps(RESULTS / study))
        at = steps[(steps["mode"] == r["mode"]) & (steps["rate"] == r["rate"]) & (steps["repeat"] == r["repeat"])]
        calib = r.get("calibration") if isinstance(r.get("calibration"), str) else study
        src = steps_of.setdefault(calib, load_steps(RESULTS / calib))
        key = {"held-out point": (calib, r["check"], r["mode"], r["rate"]),
               "held-out repeat": (calib, r["check"], r["repeat"])}.get(r["check"], (calib, r["check"]))
        if key not in fits:
            keep = {"held-out point": (src["mode"] != r["mode"]) | (src["rate"] != r["rate"]),
                    "held-out repeat": src["repeat"] != r["repeat"]}.get(r["check"], np.ones(len(src), bool))
            fits[key] = _fit(src[keep], calib)
        out.append(period_error(fits[key], at))
    return df.assign(cost_busy_err=out)


def summary(pp: pd.DataFrame) -> str:
    """Per check and study, over the points most measured repeats kept up at."""
    lines = ["| check | study | unsaturated points | within 5 % | within 10 % | mean abs error | worst | within the repeats' "
             "range | saturated points predicted saturated | knee ON meas / sim | knee OFF meas / sim |",
             "|" + "---|" * 11]
    for (check, study), g in pp.groupby(["check", "study"], sort=False):
        u, s = g[g["saturated_meas_share"] <= 0.5], g[g["saturated_meas_share"] > 0.5]
        e = u["mean_e2e_ms_err"]
        w = u.loc[e.abs().idxmax()]
        knees = [knee_step(g, m) for m in ("on", "off")]
        lines.append(f"| {check} | {study} | {len(u)} | {(e.abs() <= 0.05).sum()} | {(e.abs() <= 0.10).sum()} | "
                     f"{e.abs().mean() * 100:.1f} % | {_pct(w['mean_e2e_ms_err'])} ({w['mode'].upper()} {w['rate']:g}) | "
                     f"{int(u['within_spread'].sum())} | {int((s['saturated_sim_share'] > 0.5).sum())} of {len(s)} | "
                     f"{knees[0][0]:g} / {knees[0][1]:g} | {knees[1][0]:g} / {knees[1][1]:g} |")
    return "\n".join(lines) + "\n"


def verifiable(df: pd.DataFrame) -> str:
    """Markdown: for each held-out check and calibration, the unsaturated points, those whose measured
    mean the repeats pin to within ``TOLERANCE`` (the 95 % t-interval's half-width), the prediction
    within ``TOLERANCE`` of those, and at all of them within ``TOLERANCE`` or inside the measured
    mean's interval (where the repeats cannot tell the error from none)."""
    pp = per_point(df).merge(measured_half_width(df), on=["check", "study", "mode", "rate"])
    pp = pp[pp["check"].isin(CHECKS[:2]) & (pp["saturated_meas_share"] <= 0.5)]
    lines = ["| check | study | unsaturated points | measured mean known to ±5 % | of those, within 5 % | "
             "within 5 % or inside the measured mean's interval |", "|" + "---|" * 6]
    groups = [*pp.groupby(["check", "study"], sort=False)]
    groups += [((check, f"every calibration ({g['study'].nunique()})"), g) for check, g in pp.groupby("check", sort=False)]
    for (check, study), g in groups:
        known, known_within, consistent = verified(g["mean_e2e_ms_err"], g["e2e_meas_ci"], TOLERANCE)
        lines.append(f"| {check} | {study} | {len(g)} | {known} | {known_within} | {consistent} |")
    return "\n".join(lines) + "\n"


def coverage_problems(df: pd.DataFrame, results: Path = RESULTS) -> list[str]:
    """What async.csv misses: a calibration study or one of its points (mode, rate, repeat) not
    simulated by every check, or a measured value that is not the committed summary.csv's."""
    problems = []
    spans = gpu_span_studies(results)
    cals = calibrations(results, spans)
    expected = [(check, name) for name in cals for check in CHECKS[:2]]
    expected += [("another run", other) for name in cals for other in OTHER_RUNS.get(name, ())]
    expected += [("another workload", w) for w in other_workloads(results)]
    got = set(zip(df["check"], df["study"], strict=True))
    problems += [f"{check} {study}: not in async.csv" for check, study in sorted(set(expected) - got)]
    problems += [f"{check} {study}: not a check of a calibration study" for check, study in sorted(got - set(expected))]
    checked = {study for _, study in expected}
    problems += [f"{study}: a GPU-span default-engine study that no check simulates"
                 for study in spans if study not in checked]
    for check, study in sorted(set(expected) & got):
        rows = df[(df["check"] == check) & (df["study"] == study)].set_index(["mode", "rate", "repeat"])
        measured = pd.read_csv(results / study / "summary.csv").set_index(["mode", "rate", "repeat"])["mean_e2e_ms"]
        if sorted(rows.index) != sorted(measured.index):
            problems.append(f"{check} {study}: simulated points {sorted(rows.index)} are not the measured ones")
            continue
        off = (rows["mean_e2e_ms_meas"] - measured.reindex(rows.index)).abs() > 1e-9 * measured.reindex(rows.index)
        problems += [f"{check} {study} {m} {r:g} r{k}: measured E2E is not summary.csv's"
                     for m, r, k in rows.index[off.to_numpy()]]
    return problems


def write(df: pd.DataFrame, out: Path) -> None:
    df.to_csv(out / "async.csv", index=False)
    pp = per_point(df)
    (out / "async.md").write_text(table(pp).replace("cost model's busy-time err", "cost model's period err"))
    (out / "async-summary.md").write_text(summary(pp))
    (out / "async-verifiable.md").write_text(verifiable(df))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=RESULTS / "sim-accuracy")
    ap.add_argument("--tables-only", action="store_true", help="Only rewrite the tables from an existing async.csv.")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    if a.tables_only:
        write(pd.read_csv(a.out / "async.csv"), a.out)
        return
    rows = []
    for name in calibrations():
        d = RESULTS / name
        rows += held_out_point(d) + held_out_repeat(d)
        for other in OTHER_RUNS.get(name, ()):
            rows += another_run(d, RESULTS / other)
    for w in other_workloads():
        rows += another_run(RESULTS / WORKLOAD_CALIBRATION, RESULTS / w, "another workload")
    write(add_cost_error(pd.DataFrame(rows)), a.out)
    print(f"wrote {a.out}/async.csv, async.md, async-summary.md", file=sys.stderr)


if __name__ == "__main__":
    main()
