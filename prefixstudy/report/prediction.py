"""Stage: report (a simulated run's first screen).  What the prediction's error is made of.

A simulated run's intervals are the spread of its simulated requests over their arrival schedule:
they say nothing of how far the simulator is from the engine.  That error has two parts, measured
apart on the committed studies and shipped, with the GPU kinds each part was measured on, in
``prefixstudy/sim/accuracy.json``
(``experiments/sim/error_budget.py`` writes it from the accuracy tables):

* the **calibration**: the step cost fitted on a run, predicting that engine at points the fit did
  not see, by the kind of record it was fitted on (``cost_model.json``'s ``timing``);
* the **transfer**: that fit carried to another GPU, TP degree or model by the datasheet roofline,
  measured only between TP 1 and TP 2 on one H200, and between one H200 and one H100 at TP 1.

``sentences`` is pure: the manifest's ``sim`` entry, the run's cost model and the budget in,
sentences out."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path


def load_budget() -> dict:
    return json.loads(resources.files("prefixstudy.sim").joinpath("accuracy.json").read_text())


def load_cost(run_dir: Path) -> dict:
    try:
        return json.loads((Path(run_dir) / "cost_model.json").read_text())
    except (OSError, ValueError):
        return {}


def _where(p: dict) -> str:
    return f"{p.get('gpu', '?')} TP {p.get('tp', '?')}"


def _moves(src: dict, dst: dict) -> list[str]:
    """What the transfer changes: the GPU, the TP degree, the model."""
    out = []
    if src.get("gpu") != dst.get("gpu"):
        out.append("GPU")
    if src.get("tp") != dst.get("tp"):
        out.append("TP degree")
    if (src.get("arch"), src.get("params")) != (dst.get("arch"), dst.get("params")):
        out.append("model")
    return out


def _counts(e: dict, n_what: str = "unsaturated points") -> str:
    return (f"within 5 % of the measured mean E2E at {e['within_5pct']} of {e['unsaturated_points']} {n_what} and "
            f"within 10 % at {e['within_10pct']}, mean |error| {e['mean_abs_err'] * 100:.1f} % "
            f"({', '.join(e['studies'])})")


def calibration_sentence(sim: dict, cost: dict, budget: dict) -> str:
    timing = cost.get("timing") or "unknown"
    e = budget["calibration"].get(timing)
    source = sim.get("calibration") or cost.get("source") or "its calibration"
    if e is None:
        text = (f"Calibration on {source} ({timing} records): no committed study checks a calibration of "
                f"this kind held out, so its part of the error is unmeasured.")
    else:
        text = (f"Calibration, a fit on {source}'s {e['what']}: held out on committed {' and '.join(e['gpus'])} studies, a "
                f"calibration of this kind came {_counts(e)}.")
        if "known_to_5pct" in e:  # most points' repeats leave their measured mean less sure than 5 %
            text += (f" The repeats pin the measured mean to within 5 % at {e['known_to_5pct']} of those points; "
                     f"it came within 5 % at {e['known_within_5pct']} of them.")
    fit = cost.get("fit_error") or {}
    if "e2e_mean_abs_err" in fit:
        text += (f" This fit's own error on the {fit.get('points', '?')} points it was fitted to: mean |E2E error| "
                 f"{fit['e2e_mean_abs_err'] * 100:.1f} %.")
        if not cost.get("host"):  # sim.fit_requests: one price per step
            text += (" It prices and simulates one engine step at a time, whatever the calibration's engine did: "
                     "request timestamps cannot time a host's launch apart from its step (docs/simulator.md).")
    return text + " A calibration holds for the machine and day it ran on."


def transfer_sentence(sim: dict, budget: dict) -> str:
    src, dst = sim.get("source") or {}, sim.get("target") or {}
    moves = _moves(src, dst)
    if not moves:
        return ("Transfer: none. The simulated GPU, TP degree and model are the calibration's own, so the "
                "calibration's error is all of it.")
    measured = [budget["transfer"][k] for k, m in (("tp", "TP degree"), ("gpu", "GPU"))
                if m in moves and k in budget["transfer"]] or [budget["transfer"]["tp"]]
    kinds = set(budget["transfer"].get("gpu", {}).get("gpus", ()))
    reach = []
    if "GPU" in moves and not {_kind(src), _kind(dst)} <= kinds:
        reach.append(f"a GPU kind outside {' and '.join(sorted(kinds))}" if kinds else "another GPU")
    if max(src.get("tp") or 0, dst.get("tp") or 0) > 2:
        reach.append("a TP degree past 2")
    if "model" in moves:
        reach.append("another model")
    beyond = ("the same kind of transfer as this one" if not reach else
              f"this one also goes to {' and '.join(reach)}, where nothing has been measured: read "
              f"{'that figure' if len(measured) == 1 else 'those figures'} as the least of this part's error, "
              f"not a bound")
    parts = "; and from ".join(f"{e['what']}, where it came {_counts(e, 'points')}, high at {e['predicted_high']}"
                               for e in measured)
    return (f"Transfer, from {_where(src)} to {_where(dst)} by the datasheet roofline ({' and '.join(moves)}): "
            f"measured only from {parts}; {beyond}.")


def _kind(p: dict) -> str:
    """A GPU's kind as the budget names it: "H100-SXM" is H100."""
    return str(p.get("gpu", "?")).split("-")[0]


def of_run(manifest: dict, run_dir: Path) -> list[str]:
    """The sentences for a run whose manifest records a simulation (its ``sim`` entry); none for
    a measured run."""
    sim = manifest.get("sim")
    return sentences(sim, load_cost(run_dir), load_budget()) if isinstance(sim, dict) else []


def sentences(sim: dict, cost: dict, budget: dict) -> list[str]:
    """The first screen's sentences on what the prediction's error is made of."""
    return ["Simulated, not measured: the intervals in this report are the spread of the simulated "
            "requests over their arrival schedule, not the prediction's error. That error has two parts, "
            "measured apart (prefixstudy/sim/accuracy.json):",
            calibration_sentence(sim, cost, budget), transfer_sentence(sim, budget)]
