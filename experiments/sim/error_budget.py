"""The simulator's measured error, by part, for the first screen of a simulated run's report.

    PYTHONPATH=. python experiments/sim/error_budget.py [--check]

A prediction's error has two parts, measured apart on the committed studies (H200s and H100s):

* **calibration**: the step cost fitted on a run, predicting that run's engine at points the fit
  did not see (the held-out point checks), one entry per kind of calibration (the ``timing`` of
  ``cost_model.json``): GPU-span step records of vLLM's default engine (``async.csv``), step records
  of one engine step at a time (``accuracy.csv``), request timestamps alone (``timestamps.csv``);
* **transfer**: the same fit carried by the datasheet roofline to another TP degree (``accuracy.csv``'s
  "transfer from" checks, TP 1 and TP 2 on one H200 each way, one step at a time) and to another GPU
  kind (``gpu-transfer.csv``, experiments/sim/gpu_transfer.py: one H200 and one H100 each way, at TP 1,
  vLLM's default engine).  Nothing else has been measured: no third GPU kind, no second model.

Each entry counts the unsaturated points (what most measured repeats say), over the means of their
repeats: how many the simulator's mean E2E came within 5 and 10 % of, the mean |error|, and how many
it predicted high; and how many of them the repeats pin to within 5 % (the 95 % t-interval of the
measured mean over the repeats, ``accuracy.measured_half_width``), and within 5 % of how many of
those: where a 5 % error can be told from none.  Writes ``prefixstudy/sim/accuracy.json``, which the package ships and
``report.prediction`` quotes; ``--check`` exits 1 when the shipped file is not what the tables give.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

from prefixstudy.costmodel.gpus import find_gpu

sys.path.insert(0, str(Path(__file__).parent))
import accuracy  # noqa: E402
import timestamps  # noqa: E402

ACC = Path("experiments/results/sim-accuracy")
OUT = Path("prefixstudy/sim/accuracy.json")
# timing of cost_model.json -> (table, check, what the calibration is)
CALIBRATIONS = {
    "gpu-span": ("async.csv", "held-out point", "GPU-span step records of vLLM's default engine"),
    "engine": ("accuracy.csv", "held-out point", "step records of one engine step at a time"),
    "request-timestamps": ("timestamps.csv", "timestamps", "request timestamps alone"),
}
# By the datasheet roofline: (table, its checks as the simulator runs them, what was measured).  The
# GPU-kind table's checks with a comma are its diagnostics (the host carried another way).
TRANSFERS = {"tp": ("accuracy.csv", lambda c: c.str.startswith("transfer from"), "TP 1 to TP 2 and back, on one H200"),
             "gpu": ("gpu-transfer.csv", lambda c: c.str.startswith("transfer from") & ~c.str.contains(","),
                     "H200 to H100 and back at TP 1, on vLLM's default engine")}


def gpus(studies, results: Path = Path("experiments/results")) -> list[str]:
    """The GPU kinds the studies ran on: each manifest's device, as the GPU table names it
    ("NVIDIA H100 80GB HBM3" is H100-SXM: H100)."""
    return sorted({find_gpu(json.loads((results / s / "manifest.json").read_text())["device"]).name.split("-")[0]
                   for s in studies})


def errors(df: pd.DataFrame, table: str) -> dict:
    """The counts over one set of checked points (rows: one per point, repeat and check), and the
    studies they are of, by folder."""
    keys = ["check", "study", "mode", "rate"]
    g = df.groupby(keys)
    pp = pd.DataFrame({"sim": g["mean_e2e_ms_sim"].mean(), "meas": g["mean_e2e_ms_meas"].mean(),
                       "saturated": g["saturated_meas"].mean()})
    pp = pp.join(accuracy.measured_half_width(df).set_index(keys)["e2e_meas_ci"])
    u = pp[pp["saturated"] <= 0.5]
    err = u["sim"] / u["meas"] - 1
    known, known_within, _ = accuracy.verified(err, u["e2e_meas_ci"], 0.05)
    labels = {"accuracy.csv": accuracy.STUDIES, "timestamps.csv": timestamps.STUDIES}.get(table, {})
    folders = {label: Path(path).name for label, path in labels.items()}  # the tables' study labels
    studies = {folders.get(s, s) for s in u.index.get_level_values("study")}
    return {"studies": sorted(studies), "gpus": gpus(studies), "unsaturated_points": int(len(u)),
            "within_5pct": int((err.abs() <= 0.05).sum()), "within_10pct": int((err.abs() <= 0.10).sum()),
            "mean_abs_err": round(float(err.abs().mean()), 4), "predicted_high": int((err > 0).sum()),
            "known_to_5pct": known, "known_within_5pct": known_within}


def budget(acc: Path = ACC) -> dict:
    names = {t for t, _, _ in CALIBRATIONS.values()} | {t for t, _, _ in TRANSFERS.values()}
    tables = {name: pd.read_csv(acc / name) for name in names}
    out = {"source": f"{acc.as_posix()} (experiments/sim/error_budget.py)", "calibration": {}, "transfer": {}}
    for timing, (table, check, what) in CALIBRATIONS.items():
        df = tables[table]
        out["calibration"][timing] = {"what": what, "table": table, "check": check,
                                      **errors(df[df["check"] == check], table)}
    for kind, (table, checks, what) in TRANSFERS.items():
        df = tables[table]
        df = df[checks(df["check"])]
        out["transfer"][kind] = {"what": what, "table": table, "check": " and ".join(sorted(set(df["check"]))),
                                 **errors(df, table)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true", help="Exit 1 if the shipped file is not what the tables give.")
    a = ap.parse_args()
    text = json.dumps(budget(), indent=1) + "\n"
    if a.check:
        sys.exit(0 if OUT.read_text() == text else 1)
    OUT.write_text(text)
    print(f"wrote {OUT}", file=sys.stderr)


if __name__ == "__main__":
    main()
