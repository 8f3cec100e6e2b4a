"""Fleets: results per replica, load balance, and routing policies compared.  Pure: frames in,
frames (or lines) out; ``routing_sweep`` reads and writes the files.

* ``replica_table``: one row per mode x rate x repeat x replica: requests routed (measured ones),
  counted, failed; hit rate measured and expected (each replica's own infinite cache); busy time
  (the sum of its engine steps); mean / p90 E2E, mean TTFT and TPOT; saturation as
  ``metrics.saturation`` judges it on that replica's requests and steps.
* ``replica_summary``: one row per policy x mode x rate x replica over its repeats: requests routed,
  counted and failed (totals over the repeats), hit rate (measured and expected, over all its
  requests), ``busy_s`` (total over the repeats), mean E2E with an interval over the
  repeats (``mean_e2e_lo`` / ``mean_e2e_hi``, as ``policy_table``'s and headline.csv's:
  ``shared.bootstrap.over_repeats``, t over the repeats' means, or blocks of the replica's
  consecutive requests, which share its queue, for one repeat) and the share of repeats in which that
  replica saturated.  ``routing_sweep`` writes it as ``replicas_summary.csv``, beside
  ``replicas.csv`` (one row per repeat): the two have different keys, so one file each.
* ``balance``: per point, max / mean over replicas of requests routed and of busy time (1.0 is
  perfectly even; 2.0 with two replicas is one replica doing everything).
* ``policy_table``: one row per policy x mode x rate over its repeats: hit rate, E2E / TTFT / TPOT
  means with intervals over the repeats (``shared.bootstrap.over_repeats``, as headline.csv),
  imbalance, the share of saturated repeats; ``knees`` per policy x mode (``metrics.headline.knee``).
* ``verdicts``: per rate, in words, whether prefix affinity's extra hits outweigh its imbalance
  against a base policy: its mean E2E interval wholly below the base's (they do), wholly above
  (they don't), or overlapping (no clear difference at this load).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from prefixstudy.shared.bootstrap import over_repeats, rate_seed
from prefixstudy.metrics.headline import knee
from prefixstudy.metrics.requests import counted, hit_rates, measured, with_repeat
from prefixstudy.metrics.saturation import saturation
from prefixstudy.schema import typed_frame

POINT = ["mode", "rate", "repeat"]
_INTERVAL = "95 % interval over the repeats (t over the repeats' means, or one repeat's block bootstrap)"

# The tables of a routing sweep's parent folder, each {column: (dtype, meaning)} in file order (the
# docs' results reference prints them; routing_sweep writes them through schema.typed_frame).
# routing.csv: policy_table.
ROUTING_FIELDS: dict[str, tuple[str, str]] = {
    "policy": ("str", "the routing policy (`router.policies`)"),
    "mode": ("str", "the arm"),
    "rate": ("float64", "offered request rate, req/s"),
    "n_repeats": ("int64", "repeats of the rate"),
    "arrival_rate": ("float64", "req/s, mean over repeats of the rate each schedule actually offered"),
    **{f"mean_{m}_{end}": ("float64", what) for m, name in (("e2e", "E2E"), ("ttft", "TTFT"), ("tpot", "TPOT"))
       for end, what in (("ms", f"ms, mean {name} of the counted requests of every repeat"),
                         ("lo", f"ms, its {_INTERVAL}, lower end"), ("hi", "ms, its upper end"))},
    "hit_rate_measured": ("float64", "cached / prompt tokens of the counted requests, all replicas"),
    "hit_rate_expected": ("float64", "its bound: each replica's own infinite cache"),
    "requests_imbalance": ("float64", "max / mean over the replicas of the requests routed, mean over the repeats "
                           "(1: even; 2 with two replicas: one did everything)"),
    "busy_imbalance": ("float64", "max / mean over the replicas of their busy time, mean over the repeats"),
    "saturated_share": ("float64", "share of the repeats whose point saturated"),
}
# replicas.csv: replica_table of each policy's run, the policy added last.
REPLICAS_FIELDS: dict[str, tuple[str, str]] = {
    "mode": ("str", "the arm"),
    "rate": ("float64", "offered request rate, req/s"),
    "repeat": ("int64", "which repeat of the rate (0-based)"),
    "replica": ("int64", "which replica of the arm's fleet"),
    "n_routed": ("int64", "measured requests the router sent it"),
    "n_ok": ("int64", "of those, counted (finished without error)"),
    "n_failed": ("int64", "n_routed - n_ok"),
    "hit_rate_measured": ("float64", "cached / prompt tokens of its counted requests"),
    "hit_rate_expected": ("float64", "its bound: this replica's own infinite cache"),
    "busy_s": ("float64", "s, the sum of its engine steps (echo: of its requests' spans); 0 without steps"),
    "mean_e2e_ms": ("float64", "ms, mean E2E of its counted requests"),
    "p90_e2e_ms": ("float64", "ms, 90th percentile of E2E"),
    "mean_ttft_ms": ("float64", "ms, mean TTFT"),
    "mean_tpot_ms": ("float64", "ms, mean TPOT"),
    "saturated": ("bool", "this replica did not keep up (metrics.saturation on its requests and steps)"),
    "saturation_reason": ("str", "why, in words; empty when it kept up"),
    "policy": ("str", "the routing policy of the run"),
}
_REPLICA_TABLE = {c: f for c, f in REPLICAS_FIELDS.items() if c != "policy"}
# replicas_summary.csv: replica_summary.
REPLICAS_SUMMARY_FIELDS: dict[str, tuple[str, str]] = {
    "policy": ("str", "the routing policy"),
    "mode": ("str", "the arm"),
    "rate": ("float64", "offered request rate, req/s"),
    "replica": ("int64", "which replica of the arm's fleet"),
    "n_repeats": ("int64", "repeats in which it was routed a request"),
    "n_routed": ("int64", "measured requests routed to it, total over the repeats"),
    "n_ok": ("int64", "of those, counted"),
    "n_failed": ("int64", "n_routed - n_ok"),
    "hit_rate_measured": ("float64", "cached / prompt tokens of its counted requests over every repeat"),
    "hit_rate_expected": ("float64", "its bound: this replica's own infinite cache"),
    "busy_s": ("float64", "s, its busy time, total over the repeats"),
    "mean_e2e_ms": ("float64", "ms, mean E2E of its counted requests over every repeat"),
    "mean_e2e_lo": ("float64", f"ms, its {_INTERVAL}, lower end"),
    "mean_e2e_hi": ("float64", "ms, its upper end"),
    "saturated_share": ("float64", "share of the repeats in which this replica saturated"),
}


def _mean(s: pd.Series) -> float:
    return float(s.mean()) if len(s) else math.nan


def replica_table(requests: pd.DataFrame, iterations: pd.DataFrame) -> pd.DataFrame:
    """One row per mode x rate x repeat x replica (see the module docstring)."""
    req = with_repeat(measured(requests))
    its = with_repeat(iterations) if iterations is not None else pd.DataFrame(columns=POINT + ["replica", "step_ms"])
    rows = []
    for (mode, rate, repeat, replica), r in req.groupby(POINT + ["replica"], sort=True):
        it = its[(its["mode"] == mode) & (its["rate"] == rate) & (its["repeat"] == repeat) & (its["replica"] == replica)]
        ok = counted(r)
        hit, expected = hit_rates(r)
        sat = saturation(r, it if len(it) else None)
        rows.append({"mode": mode, "rate": float(rate), "repeat": int(repeat), "replica": int(replica),
                     "n_routed": len(r), "n_ok": len(ok), "n_failed": len(r) - len(ok),
                     "hit_rate_measured": hit, "hit_rate_expected": expected,
                     "busy_s": float(it["step_ms"].sum() / 1e3) if len(it) else 0.0,
                     "mean_e2e_ms": _mean(ok["e2e_ms"]),
                     "p90_e2e_ms": float(np.percentile(ok["e2e_ms"], 90)) if len(ok) else math.nan,
                     "mean_ttft_ms": _mean(ok["ttft_ms"]), "mean_tpot_ms": _mean(ok["tpot_ms"]),
                     "saturated": sat["saturated"], "saturation_reason": sat["reason"]})
    return typed_frame(pd.DataFrame(rows), _REPLICA_TABLE)


def replica_summary(runs: dict[str, tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]]) -> pd.DataFrame:
    """``runs``: policy -> (requests, iterations, summary), as ``policy_table``.  One row per policy
    x mode x rate x replica over the repeats (see the module docstring)."""
    rows = []
    for policy, (requests, iterations, _) in runs.items():
        req = with_repeat(measured(requests))
        per = replica_table(req, iterations)
        if per.empty:
            continue
        for (mode, rate, replica), t in per.groupby(["mode", "rate", "replica"], sort=True):
            at = req[(req["mode"] == mode) & (req["rate"] == rate) & (req["replica"] == replica)]
            # A seed per rate and replica: the same interval however many policies are compared.
            seed = np.random.SeedSequence([rate_seed(rate), int(replica)])
            e2e, lo, hi = _ci(counted(at), "e2e_ms", seed)
            hit, expected = hit_rates(at)
            rows.append({"policy": policy, "mode": mode, "rate": float(rate), "replica": int(replica),
                         "n_repeats": int(t["repeat"].nunique()), "n_routed": int(t["n_routed"].sum()),
                         "n_ok": int(t["n_ok"].sum()), "n_failed": int(t["n_failed"].sum()),
                         "hit_rate_measured": hit, "hit_rate_expected": expected, "busy_s": float(t["busy_s"].sum()),
                         "mean_e2e_ms": e2e, "mean_e2e_lo": lo, "mean_e2e_hi": hi,
                         "saturated_share": float(t["saturated"].astype(bool).mean())})
    return typed_frame(pd.DataFrame(rows), REPLICAS_SUMMARY_FIELDS)


def balance(table: pd.DataFrame) -> pd.DataFrame:
    """Per point: ``requests_imbalance`` and ``busy_imbalance``, max / mean over its replicas."""
    def ratio(s: pd.Series) -> float:
        return float(s.max() / s.mean()) if len(s) and s.mean() > 0 else math.nan

    g = table.groupby(POINT, sort=True)
    return pd.DataFrame({"requests_imbalance": g["n_routed"].apply(ratio),
                         "busy_imbalance": g["busy_s"].apply(ratio),
                         "replicas": g["replica"].nunique()}).reset_index()


def _ci(ok: pd.DataFrame, col: str, seed) -> tuple[float, float, float]:
    runs = [g.sort_values("request_index")[[col]].to_numpy(float) for _, g in ok.groupby("repeat", sort=True)]
    runs = [r for r in runs if np.isfinite(r).any()]
    if not runs:
        return _mean(ok[col]), math.nan, math.nan
    _, lo, hi = over_repeats(runs, lambda r: np.nanmean(r[:, 0]), seed=seed, bounds=(0.0, math.inf))
    return _mean(ok[col]), float(lo[0]), float(hi[0])


def policy_table(runs: dict[str, tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]]) -> pd.DataFrame:
    """``runs``: policy -> (requests, iterations, summary) of its run.  One row per policy x mode
    x rate over the repeats (see the module docstring)."""
    rows = []
    for policy, (requests, iterations, summary) in runs.items():
        req = with_repeat(requests)
        bal = balance(replica_table(req, iterations))
        ok_all = counted(req)
        for (mode, rate), s in with_repeat(summary).groupby(["mode", "rate"], sort=True):
            ok = ok_all[(ok_all["mode"] == mode) & (ok_all["rate"] == rate)]
            seeds = np.random.SeedSequence([rate_seed(rate)]).spawn(3)
            row = {"policy": policy, "mode": mode, "rate": float(rate), "n_repeats": int(s["repeat"].nunique()),
                   "arrival_rate": float(s["arrival_rate"].mean()) if "arrival_rate" in s else math.nan}
            for k, m in enumerate(("e2e", "ttft", "tpot")):
                row[f"mean_{m}_ms"], row[f"mean_{m}_lo"], row[f"mean_{m}_hi"] = _ci(ok, f"{m}_ms", seeds[k])
            at = req[(req["mode"] == mode) & (req["rate"] == rate)]
            row["hit_rate_measured"], row["hit_rate_expected"] = hit_rates(at) if len(at) else (math.nan, math.nan)
            b = bal[(bal["mode"] == mode) & (bal["rate"] == rate)]
            row["requests_imbalance"], row["busy_imbalance"] = _mean(b["requests_imbalance"]), _mean(b["busy_imbalance"])
            row["saturated_share"] = float(s["saturated"].astype(bool).mean())
            rows.append(row)
    return typed_frame(pd.DataFrame(rows), ROUTING_FIELDS)


def knees(table: pd.DataFrame) -> pd.DataFrame:
    """Per policy x mode: the knee (``metrics.headline.knee``, in actual arrival rate)."""
    rows = []
    for (policy, mode), g in table.groupby(["policy", "mode"], sort=True):
        h = g.rename(columns={"saturated_share": f"{mode}_saturated_share"})
        k, lo, hi = knee(h, mode)
        rows.append({"policy": policy, "mode": mode, "knee_rate": k, "last_ok_rate": lo, "first_saturated_rate": hi})
    return pd.DataFrame(rows)


def verdicts(table: pd.DataFrame, challenger: str = "prefix_affinity", base: str = "round_robin",
             mode: str = "on") -> list[str]:
    """Per rate where both ran: does ``challenger`` beat ``base`` on mean E2E, and with what hit
    rate and busy-time imbalance (see the module docstring)."""
    t = table[table["mode"] == mode]
    a, b = t[t["policy"] == challenger].set_index("rate"), t[t["policy"] == base].set_index("rate")
    out = []
    for rate in sorted(set(a.index) & set(b.index)):
        x, y = a.loc[rate], b.loc[rate]
        facts = (f"hit rate {x['hit_rate_measured']:.3f} vs {y['hit_rate_measured']:.3f}, busy imbalance "
                 f"{x['busy_imbalance']:.2f} vs {y['busy_imbalance']:.2f}, mean E2E {x['mean_e2e_ms']:.1f} "
                 f"[{x['mean_e2e_lo']:.1f}, {x['mean_e2e_hi']:.1f}] vs {y['mean_e2e_ms']:.1f} "
                 f"[{y['mean_e2e_lo']:.1f}, {y['mean_e2e_hi']:.1f}] ms")
        if x["mean_e2e_hi"] < y["mean_e2e_lo"]:
            verdict = f"{challenger}'s extra hits outweigh its imbalance"
        elif x["mean_e2e_lo"] > y["mean_e2e_hi"]:
            verdict = f"{challenger}'s extra hits do not outweigh its imbalance"
        else:
            verdict = f"no clear difference between {challenger} and {base} (intervals overlap)"
        sat = " (saturated in some repeat)" if max(x["saturated_share"], y["saturated_share"]) > 0 else ""
        out.append(f"{rate:g} req/s, cache {mode.upper()}: {verdict}{sat}: {facts}")
    return out
