"""KV-cache capacity as an engine axis of a grid (``grid: {capacity.blocks: [...]}``, or
``prefixstudy capacity --capacity blocks=...``): what a capacity does to the config, and the table
that reads a sweep's capacities together.  Each capacity is a run folder of its own under the
sweep's parent (``sweep.run_sweep``), whose ``sweep.json`` records each cell's working set; once read,
the parent also holds ``capacity.csv`` (``CAPACITY_FIELDS``).

Capacity is set as ``blocks`` (vLLM's ``num_gpu_blocks_override``; the echo backend's
``num_blocks``), ``bytes`` (``kv_cache_memory_bytes``) or ``share`` (``gpu_memory_utilization``);
each run's manifest records the block count the engine actually allocated.

A CPU tier's size is swept the same way, beside the GPU blocks: ``offload_gib`` (vLLM's
``kv_offloading_size``, native OffloadingConnector) or ``tier_blocks`` (the echo backend's), 0 for
no tier.  It goes to every arm of the study's own that caches (``arms:``, in ``sweep.modes``); the
built-in ON stays the GPU cache alone and OFF stays off, so each capacity's folder compares the
tier with both.  Each run's manifest records the tier's blocks the engine had.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from prefixstudy.config.arms import compared
from prefixstudy.engines.cachesim import block_hashes
from prefixstudy.config import StudyConfig
from prefixstudy.engines.registry import BACKENDS, capabilities
from prefixstudy.errors import UserError
from prefixstudy.schema import SUMMARY_FIELDS, typed_frame
from prefixstudy.results.sweep_folder import CAPACITY, POLICY, axis_values, read_index
from prefixstudy.workloads import DatasetRow

UNITS = ("blocks", "bytes", "share", "offload_gib", "tier_blocks")
# The CPU tier's units (0 is a value: no tier).  Which backend takes which unit is its declaration,
# ``capacity_units`` in prefixstudy.engines.registry.
TIER_UNITS = ("offload_gib", "tier_blocks")
TABLE = "capacity.csv"

# capacity.csv's columns in order, each with its dtype and meaning (the docs' results reference
# prints them): the capacity, then every summary.csv column of the point, then what the sweep adds.
# A count the sweep may not know (a point that failed before its engine said) is float64, NaN.
CAPACITY_FIELDS: dict[str, tuple[str, str]] = {
    "capacity_unit": ("str", "the unit swept (`--capacity UNIT=...`): `blocks`, `bytes`, `share`, `offload_gib` "
                      "or `tier_blocks`"),
    "capacity": ("float64", "the capacity of this row's run, in `capacity_unit`"),
    "policy": ("str", "the routing policy of this row's run; only in a sweep of a fleet routed by several "
               "(`replicas` > 1, `router.policies`)"),
    **SUMMARY_FIELDS,
    "num_blocks": ("float64", "KV-cache blocks the engine allocated, as its point recorded them (the manifest's "
                   "`num_blocks`; the echo backend: 0 unbounded); NaN where the point did not say"),
    "tier_blocks": ("int64", "blocks of the CPU tier under the cache (the manifest's `tier_blocks`); 0: no tier"),
    "working_set_blocks": ("float64", "whole prompt blocks that more than one request of the dataset has: what "
                           "the cache must hold for every reuse to hit; NaN where the block size is unknown"),
    "working_set_ratio": ("float64", "working_set_blocks / (num_blocks - 1): above 1 the working set does not "
                          "fit (one block is vLLM's null block)"),
    "reuse_footprint_blocks": ("float64", "median over the reusing requests of the distinct blocks cached "
                               "between two uses of a block (the LRU queue's churn, `reuse_footprint_blocks`); "
                               "NaN where unknown"),
    "reuse_footprint_ratio": ("float64", "reuse_footprint_blocks / (num_blocks - 1): above 1 an LRU cache "
                              "evicts a block before its reuse"),
    "e2e_gain": ("float64", "(baseline - arm) / baseline of mean E2E, against the baseline arm (`sweep.baseline`, "
                 "OFF by default) at the same capacity, rate and repeat; NaN on the baseline's rows"),
    "ttft_gain": ("float64", "the same for mean TTFT"),
}


def parse_capacity(text: str) -> tuple[str, list[float]]:
    """``"blocks=12,16"`` -> ``("blocks", [12.0, 16.0])``."""
    unit, sep, values = text.partition("=")
    if not sep or unit not in UNITS:
        raise UserError(f"--capacity '{text}': expected UNIT=V1,V2,... with UNIT one of {', '.join(UNITS)}")
    try:
        out = [float(v) for v in values.split(",") if v.strip()]
    except ValueError:
        raise UserError(f"--capacity '{text}': values must be numbers") from None
    if unit in TIER_UNITS:
        if not out or any(not (v >= 0 and math.isfinite(v)) for v in out):
            raise UserError(f"--capacity '{text}': values must be finite numbers >= 0 (0: no tier)")
    elif not out or any(not (v > 0 and math.isfinite(v)) for v in out):
        raise UserError(f"--capacity '{text}': values must be finite numbers > 0")
    if unit == "share" and max(out) > 1:
        raise UserError(f"--capacity '{text}': a share of memory is at most 1")
    return unit, out


def capacity_config(cfg: StudyConfig, unit: str, value: float) -> StudyConfig:
    """``cfg`` with its KV cache set to ``value`` ``unit``s."""
    sub = cfg.model_copy(deep=True)
    e = sub.engine
    if unit in TIER_UNITS:
        return _with_tier(sub, unit, value)
    own = [u for u in capabilities(e.kind).capacity_units if u not in TIER_UNITS]
    if unit not in own:
        raise UserError(f"--capacity {unit}: engine.kind {e.kind} " + (f"takes capacity in {' or '.join(own)} only"
                        if own else f"has no cache size to set ({_takers(u for u in UNITS if u not in TIER_UNITS)})"))
    e.set_capacity(unit, value)
    return sub


def _takers(units) -> str:
    """Which backends take which of ``units``: "blocks: vllm, blocks: echo, ..."."""
    return ", ".join(f"{u}: {k}" for u in units for k, b in BACKENDS.items() if u in b.can.capacity_units)


def _with_tier(sub: StudyConfig, unit: str, value: float) -> StudyConfig:
    """``sub`` with a CPU tier of ``value`` on every arm of its own that caches (0: none)."""
    from prefixstudy.config.arms import OffloadConfig

    kind = sub.engine.kind
    if unit not in capabilities(kind).capacity_units:
        raise UserError(f"--capacity {unit}: engine.kind {kind} has no such tier ({_takers(TIER_UNITS)})")
    arms = [a for a in sub.arms if a.prefix_caching and a.name in sub.sweep.modes]
    if not arms:
        raise UserError(f"--capacity {unit}: the tier goes to the study's own arms that cache, and it runs none "
                        f"(add one, e.g. arms: [{{name: on-cpu}}], and keep it in sweep.modes)")
    for a in arms:
        if unit == "tier_blocks":
            a.engine = {**a.engine, "tier_blocks": int(value) or None}
        else:
            backend = a.offload.backend if a.offload is not None else "native"
            a.offload = OffloadConfig(size_gib=value, backend=backend) if value > 0 else None
    return sub


def working_set_blocks(rows: list[DatasetRow], block: int) -> int:
    """Whole prompt blocks that more than one request of the dataset has: what a cache must hold
    for every reuse to hit.  (Later turns of sessions count by their own new tokens only.)"""
    seen: dict[int, int] = {}
    for r in rows:
        for h in set(block_hashes(r.prompt_token_ids, block)):
            seen[h] = seen.get(h, 0) + 1
    return sum(1 for n in seen.values() if n > 1)


def reuse_footprint_blocks(rows: list[DatasetRow], block: int, primes: list[list[int]] = (),
                           limit: int = 500) -> int | None:
    """How many blocks an LRU cache must hold for a reuse to hit: for each request that reuses a
    prompt block, the distinct whole blocks cached since that block's previous use, its own
    request's included (prompt and generated tokens; outputs are never shared); the median over
    those requests.
    ``primes`` (the group prefixes sent before a point) count as earlier uses, but a reuse of a prime
    only counts when no request reuses another request's blocks: right after priming the spans are
    shorter than in the steady state this number is meant to describe.  The working set
    counts only the shared blocks; this counts everything that churns the LRU queue between two
    uses (the one-off prompts and every request's unique tail), which is what decides eviction.
    Later turns of sessions count by their new tokens only; the first ``limit`` requests."""
    seqs = [(list(p), 1) for p in primes] + [(r.prompt_token_ids, r.output_len) for r in rows[:limit]]
    last: dict = {}  # block -> index of its last use
    touched: list[set] = []
    steady: list[int] = []
    after_prime: list[int] = []
    fresh = 0
    for k, (prompt, n_out) in enumerate(seqs):
        hs = block_hashes(prompt, block)
        # Whole blocks only (a partial one is never cached, and is reused first), generated tokens
        # included but the last (sampled, never computed): what the request leaves in the cache.
        n_new = max((len(prompt) + n_out - 1) // block - len(hs), 0)
        own = set(hs) | {("out", fresh + i) for i in range(n_new)}
        fresh += n_new
        reused = [h for h in hs if h in last]
        if reused and k >= len(primes):
            j = last[reused[0]]
            (steady if j >= len(primes) else after_prime).append(len(set().union(own, *touched[j + 1:k])))
        for h in hs:
            last[h] = k
        touched.append(own)
    spans = steady or after_prime
    return int(np.median(spans)) if spans else None


def capacity_table(parent: Path) -> pd.DataFrame:
    """One row per capacity x point: the engine's blocks, working set ÷ usable blocks, hit rates
    (measured, with the engine's blocks, infinite cache), latency, and the gain over the baseline
    arm (capacity.csv: ``CAPACITY_FIELDS``; ``policy`` only where the sweep ran several)."""
    from prefixstudy.results import load

    index = read_index(parent)
    found = axis_values(index, CAPACITY)
    if found is None:
        raise UserError(f"{parent}: its sweep has no capacity axis (not a capacity sweep folder)")
    axis, unit = found[0], found[0][len(CAPACITY):]
    out = []
    for r in index["cells"]:
        if not (parent / r["dir"] / "manifest.json").is_file():
            continue  # a cell not started yet: nothing of it to read
        res = load(parent / r["dir"])
        blocks = {p["mode"]: p.get("num_blocks") for p in res.manifest["points"]}
        tiers = {p["mode"]: p.get("tier_blocks", 0) for p in res.manifest["points"]}
        s = res.summary.copy()
        if POLICY in r["values"]:
            s.insert(0, "policy", r["values"][POLICY])
        s.insert(0, "capacity", float(r["values"][axis]))
        s.insert(0, "capacity_unit", unit)
        s["num_blocks"] = s["mode"].map(blocks).astype(float)
        s["tier_blocks"] = s["mode"].map(tiers).fillna(0)  # the CPU tier's offload blocks, 0: none
        s["working_set_blocks"] = r.get("working_set_blocks")
        s["working_set_ratio"] = s["working_set_blocks"] / (s["num_blocks"] - 1)  # one block is vLLM's null block
        s["reuse_footprint_blocks"] = r.get("reuse_footprint_blocks")
        s["reuse_footprint_ratio"] = s["reuse_footprint_blocks"] / (s["num_blocks"] - 1)
        out.append(s)
    df = pd.concat(out, ignore_index=True)
    keys = ["capacity", "policy"] if "policy" in df else ["capacity"]
    fields = CAPACITY_FIELDS if "policy" in df else {k: v for k, v in CAPACITY_FIELDS.items() if k != "policy"}
    return typed_frame(with_gain(df, keys, sweep_arms(parent)[1]), fields)


def sweep_arms(parent: Path) -> tuple[str, str | None]:
    """The arm a capacity sweep reads collapse on and the baseline its gains are against
    (``arms.compared``; ON and OFF by default), from its first run's recorded config."""
    from prefixstudy.results import load
    from prefixstudy.results.finish import study_arms

    runs = [c for c in read_index(parent)["cells"] if (parent / c["dir"] / "manifest.json").is_file()]
    if not runs:
        return "on", "off"
    arms, baseline = study_arms(load(parent / runs[0]["dir"]))
    return compared(arms, baseline)[0], baseline


def with_gain(df: pd.DataFrame, keys: list[str], baseline: str | None = "off") -> pd.DataFrame:
    """Adds ``e2e_gain`` and ``ttft_gain``: (baseline - arm) / baseline of the means, on every row
    of an arm but the baseline, matched on ``keys`` + the point key columns (rate, and repeat where
    results have it); NaN throughout without a baseline."""
    on = [k for k in keys + ["rate", "repeat"] if k in df]
    off = df[df["mode"] == baseline][on + ["mean_e2e_ms", "mean_ttft_ms"]]
    m = df.merge(off, on=on, how="left", suffixes=("", "_off"))
    for x in ("e2e", "ttft"):
        gain = (m[f"mean_{x}_ms_off"] - m[f"mean_{x}_ms"]) / m[f"mean_{x}_ms_off"]
        m[f"{x}_gain"] = gain.where(m["mode"] != baseline)
    return m.drop(columns=["mean_e2e_ms_off", "mean_ttft_ms_off"])


def ratio_column(table: pd.DataFrame) -> tuple[str, str]:
    """The capacity ratio to read collapse on, and its name: blocks cached between two uses ÷
    capacity where the sweep recorded it (it decides LRU eviction), else working set ÷ capacity."""
    if "reuse_footprint_ratio" in table and table["reuse_footprint_ratio"].notna().all():
        return "reuse_footprint_ratio", "blocks cached between two uses ÷ capacity"
    return "working_set_ratio", "working set ÷ capacity"


def collapse_lines(table: pd.DataFrame, share: float = 0.5, arm: str = "on") -> list[str]:
    """Per rate (and routing policy, where the sweep ran several), in words: the smallest capacity
    ratio at which ``arm``'s measured hit rate (ON's by default, ``sweep_arms``) is below ``share``
    of the infinite-cache bound (the cache no longer holds the reuse), with the hit rate and E2E
    gain on either side; or that it never fell over the capacities run (``ratio_column``)."""
    x, name = ratio_column(table)
    on = table[table["mode"] == arm].sort_values(x, kind="stable")
    out = []
    for key, g in on.groupby(["policy", "rate"] if "policy" in on else ["rate"], sort=True):
        *policy, rate = key
        at = f"{rate:g} req/s" + "".join(f" ({p})" for p in policy)
        low = g["hit_rate_measured"] < share * g["hit_rate_expected"]
        if not low.any():
            w = g.loc[(g["hit_rate_measured"] / g["hit_rate_expected"]).idxmin()]
            out.append(f"{at}: the hit rate stayed at or above {share:.0%} of its bound at every capacity "
                       f"run ({name} up to {g[x].max():.2f}; lowest {w['hit_rate_measured']:.3f} of "
                       f"{w['hit_rate_expected']:.3f}, at {w[x]:.2f})")
            continue
        k = int(low.to_numpy().argmax())
        after = g.iloc[k]
        gain = "" if pd.isna(after.get("e2e_gain")) else f", E2E gain {after['e2e_gain']:.1%}"
        if k == 0:
            out.append(f"{at}: collapsed already at {name} {after[x]:.2f} "
                       f"(hit rate {after['hit_rate_measured']:.3f}{gain})")
            continue
        before = g.iloc[k - 1]
        gain0 = "" if pd.isna(before.get("e2e_gain")) else f", E2E gain {before['e2e_gain']:.1%}"
        out.append(f"{at}: the hit rate collapses between {name} {before[x]:.2f} (hit rate "
                   f"{before['hit_rate_measured']:.3f}{gain0}) and {after[x]:.2f} (hit rate "
                   f"{after['hit_rate_measured']:.3f}{gain})")
    return out
