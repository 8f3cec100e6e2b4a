"""The simulator calibrated from request timestamps alone, against the step-record calibration, on
the same held-out points.

    PYTHONPATH=. python experiments/sim/timestamps.py [--studies h200-tp1,h200-tp2,h200-vllm-server,...]
                                                     [--out experiments/results/sim-accuracy] [--tables-only]

For each study and each point (mode, rate): fit the step cost on the study's OTHER points (every
repeat of this one left out, as ``accuracy.py`` does) twice, from its step records (``costmodel.step_cost.fit``)
and from its request timestamps alone (``sim.fit_requests.fit_timestamps``: the simulator inside the
fit, the step records unread; it fits unsaturated points only, so a saturated point is predicted by
the fit on all the others), then simulate every repeat of the point on its own arrival schedule
(``accuracy.simulate_points``) and compare with the measurement.  ``h200-vllm-server`` (``vllm
serve`` over HTTP) has no step records; its step-record column is the in-process study of the same
engine and GPU, ``h200-tp1`` (vLLM's default engine, steps timed on the GPU), fitted on all its
steps, none of which are the server's.  ``h100-vllm-server`` (the same server on an H100) and
``h100-tp1`` (the same engine in process on an H100, through Ray: host stamps only) take theirs from
``h100-tp1-spans`` (that engine in process on an H100, steps timed on the GPU), which is also held
out itself.  A study's own step records are fitted as ``prefixstudy simulate --calibration`` fits
them (``async_recorded``: the default engine's GPU and host parts).  Writes
timestamps.csv (one row per point, repeat and calibration), timestamps-summary.md (the table in
docs/simulator.md), timestamps.md (per point) and timestamps-verifiable.md (``verifiable``: where the
repeats pin the measured mean closely enough to check the 10 % goal).  ``--studies`` re-runs those studies and keeps the
others' rows; ``--calibrations`` re-runs only those columns (``step records`` after a change to the
step-record fit, whose timestamp fits it leaves as they are).

``--pipelined`` is the variant that ``prefixstudy simulate`` does not ship: a study whose engine
scheduled step N+1 while step N ran (``ran_pipelined``) is fitted and simulated that way, with no
host launch (timestamps cannot time one apart from the step), where the shipped fit simulates every
engine one step at a time.  Only the timestamp column of those studies; its tables go to
sim-accuracy/timestamps-pipelined.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import pandas as pd

from prefixstudy.config import load_config
from prefixstudy.costmodel.arch import load_arch
from prefixstudy.costmodel.step_cost import HOST_OVERLAP, async_recorded, fit, fit_study, load_steps
from prefixstudy.sim.fit_requests import fit_points, fit_timestamps, has_step_records, load_run
from prefixstudy.study.simulate import calibration_hardware
from prefixstudy.sim.sessions import DEFAULT_BLOCK_SIZE, SimTarget, block_count
from prefixstudy.workloads import load_rows

_spec = importlib.util.spec_from_file_location("accuracy", Path(__file__).with_name("accuracy.py"))
accuracy = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(accuracy)

RESULTS = Path("experiments/results")
STUDIES = {"h200-tp1": RESULTS / "h200-tp1-sync", "h200-tp2": RESULTS / "h200-tp2",
           "h200-vllm-server": RESULTS / "h200-vllm-server", "h100-vllm-server": RESULTS / "h100-vllm-server",
           "h100-tp1": RESULTS / "h100-tp1", "h100-tp1-spans": RESULTS / "h100-tp1-spans"}
# A study without step records that a step cost can be fitted on: the step-record calibration is
# another study's, of the same engine on the same GPU kind (vLLM's default engine in process, steps
# timed on the GPU).
STEP_RECORDS_OF = {"h200-vllm-server": RESULTS / "h200-tp1", "h100-vllm-server": RESULTS / "h100-tp1-spans",
                   "h100-tp1": RESULTS / "h100-tp1-spans"}
CALIBRATIONS = ("step records", "timestamps")
NO_HOST = {"c0_ms": 0.0, "coef_ms": {}, "overlap": HOST_OVERLAP}  # --pipelined: no host launch to price


def ran_pipelined(study_dir: Path) -> bool:
    """Whether a study's engine scheduled step N+1 while step N ran: its config's
    ``engine.async_scheduling`` where set, else its step records' timing, else vLLM's default on a
    GPU (every study here ran vLLM on one; ``vllm serve`` records no steps)."""
    steps = load_steps(study_dir) if (study_dir / "iterations.parquet").exists() else None
    if steps is not None and len(steps):
        return async_recorded(study_dir, steps)  # the config's setting, else the steps' timing
    setting = getattr(load_config(study_dir / "config.yaml").engine, "async_scheduling", None)
    return True if setting is None else bool(setting)


def calibrations_of(name: str) -> tuple[str, ...]:
    """The calibrations a study is held out with: a server run on a GPU that no in-process study
    of the same engine ran on has no step-record calibration to set beside its timestamps."""
    return CALIBRATIONS if name in STEP_RECORDS_OF or has_step_records(STUDIES[name]) else ("timestamps",)


def held_out(name: str, study_dir: Path, only: tuple[str, ...] = CALIBRATIONS, pipelined: bool = False) -> list[dict]:
    cfg = load_config(study_dir / "config.yaml")
    host = NO_HOST if pipelined and ran_pipelined(study_dir) else None
    rows = load_rows(cfg)
    gpu, tp, _ = calibration_hardware(study_dir)
    target = SimTarget(gpu.name, tp, block_count(cfg, load_arch(cfg.model), gpu, tp, DEFAULT_BLOCK_SIZE),
                       DEFAULT_BLOCK_SIZE, None)
    req, summary = load_run(study_dir)
    # The timestamp fit uses the unsaturated points only: a saturated one is held out of the fit on all.
    fitted = set(fit_points(req, summary)[["mode", "rate"]].itertuples(index=False, name=None))
    other = STEP_RECORDS_OF.get(name)
    checks = tuple(c for c in calibrations_of(name) if c in only)
    steps = load_steps(study_dir) if "step records" in checks and not other else None
    # The study's own steps are fitted as `prefixstudy simulate --calibration` fits them.
    async_scheduling = steps is not None and async_recorded(study_dir, steps)
    fits: dict[tuple, object] = {}

    def cost(calibration: str, mode: str, rate: float):
        # The point a fit leaves out (None: one fit serves every point): another study's step records
        # leave none out of theirs, and the timestamp fit is on the unsaturated points only.
        if calibration == "step records":
            point = None if other else (mode, rate)
        else:
            point = (mode, rate) if (mode, rate) in fitted else None
        key = (calibration, point)
        if key not in fits:
            if calibration == "step records":
                fits[key] = fit_study(other) if other else fit(steps[(steps["mode"] != mode) | (steps["rate"] != rate)],
                                                               async_scheduling=async_scheduling)
            else:
                print(f"{name}: timestamp fit without {point or 'the saturated points'}", file=sys.stderr)
                keep = (req["mode"] != mode) | (req["rate"] != rate) if point else slice(None)
                fits[key] = fit_timestamps(cfg, rows, target, req[keep], summary, f"{study_dir} without {point}",
                                           host=host)
        return fits[key]

    out = []
    for calibration in checks:
        for r in accuracy.simulate_points(study_dir, lambda m, r, c=calibration: cost(c, m, r), calibration):
            c = cost(calibration, r["mode"], r["rate"])
            fe = c.fit_error
            out.append({**r, "study": name, "c0_ms": c.c0_ms, **{f"coef_{t}": v for t, v in c.coef_ms.items()},
                        "fit_e2e_mean_abs_err": fe.get("e2e_mean_abs_err"), "fit_simulations": fe.get("simulations")})
    return out


def per_point(df: pd.DataFrame) -> pd.DataFrame:
    keys = ["check", "study", "mode", "rate"]
    g = df.groupby(keys, sort=False)
    cols = [f"{k}_{w}" for k in ("mean_e2e_ms", "mean_ttft_ms", "mean_tpot_ms") for w in ("meas", "sim")]
    out = g[cols].mean()
    out["n_repeats"] = g.size()
    out["saturated_meas_share"] = g["saturated_meas"].mean()
    out["saturated_sim_share"] = g["saturated_sim"].mean()
    for k in ("mean_e2e_ms", "mean_ttft_ms", "mean_tpot_ms"):
        out[f"{k}_err"] = out[f"{k}_sim"] / out[f"{k}_meas"] - 1
    return out.reset_index()


def _pct(x: float) -> str:
    return f"{x * 100:+.1f} %"


def summary(pp: pd.DataFrame) -> str:
    """Per study and calibration, over the points most of whose repeats kept up (as measured)."""
    lines = ["| study | calibration | unsaturated points | within 5 % | within 10 % | mean abs E2E error | worst "
             "| mean abs TPOT error | saturated points predicted saturated |", "|" + "---|" * 9]
    for (study, check), g in pp.groupby(["study", "check"], sort=False):
        u = g[g["saturated_meas_share"] <= 0.5]
        s = g[g["saturated_meas_share"] > 0.5]
        e = u["mean_e2e_ms_err"]
        w = u.loc[e.abs().idxmax()]
        name = (f"{check} ({STEP_RECORDS_OF[study].name}, in process)" if check == "step records" and study in STEP_RECORDS_OF
                else check)
        lines.append(f"| {study} | {name} | {len(u)} | {(e.abs() <= 0.05).sum()} | {(e.abs() <= 0.10).sum()} | "
                     f"{e.abs().mean() * 100:.1f} % | {_pct(w['mean_e2e_ms_err'])} ({w['mode'].upper()} {w['rate']:g}) | "
                     f"{u['mean_tpot_ms_err'].abs().mean() * 100:.1f} % | "
                     f"{int((s['saturated_sim_share'] > 0.5).sum())} of {len(s)} |")
    return "\n".join(lines) + "\n"


GOAL = 0.10  # a timestamp-only calibration's goal: E2E within 10 % of the measured mean


def verifiable(df: pd.DataFrame) -> str:
    """Markdown, per calibration over every study: the unsaturated held-out points, those whose
    repeats pin the measured mean to within ``GOAL`` (the 95 % t-interval's half-width; a point with
    one repeat has none), the prediction within ``GOAL`` of those, and at all of them within ``GOAL``
    or inside the measured mean's interval (where the repeats cannot tell the error from none)."""
    pp = per_point(df).merge(accuracy.measured_half_width(df), on=["check", "study", "mode", "rate"])
    u = pp[pp["saturated_meas_share"] <= 0.5]
    lines = ["| calibration | unsaturated points | measured mean known to ±10 % | of those, within 10 % | "
             "within 10 % or inside the measured mean's interval |", "|" + "---|" * 5]
    for check, g in u.groupby("check", sort=False):
        known, known_within, consistent = accuracy.verified(g["mean_e2e_ms_err"], g["e2e_meas_ci"], GOAL)
        lines.append(f"| {check} | {len(g)} | {known} | {known_within} | {consistent} |")
    return "\n".join(lines) + "\n"


def table(pp: pd.DataFrame) -> str:
    lines = ["| study | calibration | mode | rate | repeats | E2E mean sim / meas (ms) | err | TTFT sim / meas (ms) "
             "| TPOT err | saturated sim / meas |", "|" + "---|" * 10]
    for _, r in pp.iterrows():
        lines.append(f"| {r['study']} | {r['check']} | {r['mode']} | {r['rate']:g} | {r['n_repeats']} | "
                     f"{r['mean_e2e_ms_sim']:.0f} / {r['mean_e2e_ms_meas']:.0f} | {_pct(r['mean_e2e_ms_err'])} | "
                     f"{r['mean_ttft_ms_sim']:.1f} / {r['mean_ttft_ms_meas']:.1f} | {_pct(r['mean_tpot_ms_err'])} | "
                     f"{r['saturated_sim_share']:.0%} / {r['saturated_meas_share']:.0%} |")
    return "\n".join(lines) + "\n"


def claims(pp: pd.DataFrame) -> list[str]:
    """The sentences docs/simulator.md states from the table, one per study: within 10 % of how
    many unsaturated held-out points, timestamps only and from step records."""
    out = []
    for study, g in pp.groupby("study", sort=False):
        u = g[g["saturated_meas_share"] <= 0.5]
        n = {c: int((u[u["check"] == c]["mean_e2e_ms_err"].abs() <= 0.10).sum()) for c in set(u["check"])}
        points = int((u["check"] == "timestamps").sum())
        beside = f"step records: {n['step records']}" if "step records" in n else "no step-record calibration on this GPU"
        out.append(f"{study}: timestamps only, within 10 % at {n['timestamps']} of {points} held-out points ({beside})")
    return out


def pipelined_claims(shipped: pd.DataFrame, variant: pd.DataFrame) -> list[str]:
    """docs/simulator.md's sentences on the ``--pipelined`` variant, one per study it ran: its timestamp
    fit's unsaturated held-out points within 10 % and mean |error|, beside the shipped fit's."""
    def tally(df: pd.DataFrame, study: str) -> tuple[int, int, float]:
        pp = per_point(df[(df["study"] == study) & (df["check"] == "timestamps")])
        e = pp[pp["saturated_meas_share"] <= 0.5]["mean_e2e_ms_err"].abs()
        return len(e), int((e <= 0.10).sum()), float(e.mean())

    out = []
    for study in variant["study"].unique():
        (n, v10, vm), (_, s10, sm) = tally(variant, study), tally(shipped, study)
        out.append(f"{study}: pipelined, within 10 % at {v10} of {n} held-out points, mean |error| {vm * 100:.1f} %; "
                   f"one step at a time (shipped) {s10} and {sm * 100:.1f} %")
    return out


def write(df: pd.DataFrame, out: Path) -> None:
    df.to_csv(out / "timestamps.csv", index=False)
    pp = per_point(df)
    (out / "timestamps-summary.md").write_text(summary(pp))
    (out / "timestamps.md").write_text(table(pp))
    (out / "timestamps-verifiable.md").write_text(verifiable(df))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=RESULTS / "sim-accuracy")
    ap.add_argument("--studies", default=",".join(STUDIES))
    ap.add_argument("--calibrations", default=",".join(CALIBRATIONS),
                    help="Re-run only these columns of the studies (step records, timestamps).")
    ap.add_argument("--tables-only", action="store_true", help="Only rewrite the tables from timestamps.csv.")
    ap.add_argument("--pipelined", action="store_true",
                    help="The variant (module docstring): the studies that ran pipelined, timestamps only, into "
                         "sim-accuracy/timestamps-pipelined unless --out says otherwise.")
    a = ap.parse_args()
    if a.pipelined:
        a.out = a.out / "timestamps-pipelined" if a.out == RESULTS / "sim-accuracy" else a.out
        a.out.mkdir(parents=True, exist_ok=True)
        if a.studies == ",".join(STUDIES):
            a.studies = ",".join(n for n, d in STUDIES.items() if ran_pipelined(d))
        a.calibrations = "timestamps"
    path = a.out / "timestamps.csv"
    old = pd.read_csv(path) if path.exists() else pd.DataFrame({"study": []})
    if a.tables_only:
        write(old, a.out)
        return
    names, only = a.studies.split(","), tuple(a.calibrations.split(","))
    rows = [r for n in names for r in held_out(n, STUDIES[n], only, a.pipelined)]
    kept = old[~(old["study"].isin(names) & old["check"].isin(only))] if len(old) else old
    df = pd.concat([kept, pd.DataFrame(rows)], ignore_index=True)
    order = {n: i for i, n in enumerate(STUDIES)}
    df = df.sort_values(["study", "check"], key=lambda s: s.map(order) if s.name == "study" else s.map(
        {c: i for i, c in enumerate(CALIBRATIONS)}), kind="stable")
    write(df, a.out)
    print(f"wrote {a.out}/timestamps.csv, timestamps.md", file=sys.stderr)


if __name__ == "__main__":
    main()
