"""Report sections for the many-prefix, multi-turn and trace workloads: the cache's capacity and
eviction per point, and per-turn / per-group breakdowns, every arm against the baseline (ON vs OFF by
default).  Empty for one-prompt studies."""

from __future__ import annotations

import pandas as pd

from prefixstudy.config.arms import compared
from prefixstudy.metrics.breakdown import breakdown
from prefixstudy.results.finish import study_arms

CAPACITY_TEXT = ("Expected = an infinite cache (the upper bound); estimated = the engine's own block count, "
                 "replayed through a model of vLLM's block pool (least recently used blocks evicted first), "
                 "each request holding its blocks from when the engine scheduled it to its last token, so "
                 "requests in flight together pin blocks (all of a request's blocks from its start; no "
                 "preemption): exact at max_num_seqs 1. Estimated below expected is eviction, reported here "
                 "and not a failed check.")


def capacity_frame(study) -> pd.DataFrame:
    """Per point of the arm compared with the baseline (ON by default, ``arms.compared``): the
    engine's blocks, estimated evictions and the three hit rates."""
    pts = pd.DataFrame(study.manifest.get("points", []))
    s = study.summary
    if pts.empty or "num_blocks" not in pts or "hit_rate_estimated" not in s:
        return pd.DataFrame()
    arm = compared(*study_arms(study))[0]
    on = s[s["mode"] == arm][["rate", "hit_rate_measured", "hit_rate_estimated", "hit_rate_expected"]]
    cols = [c for c in ("rate", "block_size", "num_blocks", "evicted_blocks_estimated") if c in pts]
    return pts[pts["mode"] == arm][cols].merge(on, on="rate", how="inner")


def workload_blocks(study) -> list[tuple]:
    """Report blocks: cache capacity (when recorded), per turn (sessions), per group (> 1 group)."""
    out: list[tuple] = []
    cap = capacity_frame(study)
    if not cap.empty:
        out += [("h2", "Cache capacity and eviction"), ("p", CAPACITY_TEXT), ("table", cap)]
    req, baseline = study.requests, study_arms(study)[1]
    if "turn" in req and (req["turn"] > 0).any():
        out += [("h2", "Per turn"),
                ("p", "Cached share = cached / prompt tokens of the turn's counted requests; gains are "
                      + ("(OFF − ON) / OFF of the means." if baseline in ("off", None) else
                         f"(baseline − arm) / baseline of the means, against {baseline}.")),
                ("table", breakdown(req, "turn", baseline))]
    if req["group"].nunique() > 1:
        out += [("h2", "Per prefix group"), ("table", breakdown(req, "group", baseline))]
    return out
