"""Join runs of one study made apart (caching ON and OFF side by side, one GPU or one machine
each) into one run folder, as if one run had made them."""

from __future__ import annotations

from pathlib import Path

from prefixstudy.config import flat_config, parse_config
from prefixstudy.errors import UserError
from prefixstudy.results import find_run_dir, load
from prefixstudy.results.store import CONFIG
from prefixstudy.results.writer import ResultsWriter, new_run_dir, preflight_out
from prefixstudy.schema import PointResult, point_key


def merge_runs(run_dirs: list[Path], out: Path) -> Path:
    """Join runs of one study made apart (e.g. caching ON and OFF side by side, one GPU or one
    machine each) into one run folder.  Their configs must agree on everything but the modes."""
    runs = [load(find_run_dir(d)) for d in run_dirs]
    if len(runs) < 2:
        raise UserError("merge: give at least two run folders")
    base = flat_config(runs[0].config)
    modes: list[str] = []
    for r in runs:
        flat = flat_config(r.config)
        diff = sorted(k for k in base.keys() | flat.keys()
                      if k not in ("sweep.modes", "sweep.only_repeats", "out") and base.get(k) != flat.get(k))
        if diff:
            raise UserError(f"{r.path}: config differs from {runs[0].path} at field '{diff[0]}'; "
                            "only runs of one study can be merged")
        modes += [m for m in r.config.get("sweep", {}).get("modes", []) if m not in modes]
    seen = [point_key(p) for r in runs for p in r.manifest.get("points", [])]
    if len(seen) != len(set(seen)):
        raise UserError("merge: two runs hold the same point (mode, rate and repeat); merge runs of different "
                        "modes or repeats")
    data = dict(runs[0].config)
    data["sweep"] = {**data.get("sweep", {}), "modes": sorted(modes, key=["on", "off"].index), "only_repeats": None}
    cfg = parse_config(data, str(runs[0].path / CONFIG))
    manifest = dict(runs[0].manifest)
    manifest.update(
        started_at=min(r.manifest.get("started_at") or "" for r in runs),
        ended_at=max(r.manifest.get("ended_at") or "" for r in runs),
        status="complete" if all(r.manifest.get("status") == "complete" for r in runs) else "complete_with_failures",
        merged_from=[{"run": str(r.path), "modes": r.config.get("sweep", {}).get("modes"),
                      "device": r.manifest.get("device"), "executor": r.manifest.get("executor"),
                      "started_at": r.manifest.get("started_at"), "status": r.manifest.get("status")} for r in runs],
    )
    run_dir = new_run_dir(cfg, out)
    preflight_out(run_dir)
    writer = ResultsWriter(run_dir, cfg, manifest)
    writer.start()
    for r in runs:
        for p in r.manifest.get("points", []):
            key = point_key(p)
            meta = {k: v for k, v in p.items() if k not in ("mode", "rate", "repeat")}
            writer.add(PointResult(key[0], key[1], _at(r.requests, key), _at(r.iterations, key), meta, key[2]))
    writer.finish()
    return run_dir


def _at(df, key: tuple[str, float, int]):
    return df[(df["mode"] == key[0]) & (df["rate"] == key[1]) & (df["repeat"] == key[2])]
