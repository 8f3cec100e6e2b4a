"""The arms of a study config, checked against its engine: refused in one line naming the field
when they cannot mean what they say (prefixstudy.config.arms holds their schema)."""

from __future__ import annotations

from pydantic import ValidationError

from prefixstudy.config.arms import BUILTIN_ARMS, OFFLOAD_ARGS, OFFLOAD_PACKAGES, ArmConfig, arm_engine
from prefixstudy.config.schema import StudyConfig
from prefixstudy.engines.registry import capabilities, kinds_that
from prefixstudy.errors import UserError, installed


def _source(source: str, overrides: dict | None, *fields: str) -> str:
    for k in overrides or ():
        if any(f == k or f.startswith(f"{k}.") or k.startswith(f"{f}.") for f in fields):
            return f"--set {k}" if k != "sweep.modes" else "--modes/--set sweep.modes"
    return source


def check_arms(cfg: StudyConfig, source: str, overrides: dict | None = None) -> None:
    """Refuse, in one line naming the field, an arm config that cannot mean what it says."""
    def fail(field: str, msg: str, *origin: str) -> None:
        raise UserError(f"{_source(source, overrides, field, *origin)}: field '{field}': {msg}")

    seen: set[str] = set()
    for i, a in enumerate(cfg.arms):
        if a.name in BUILTIN_ARMS:
            fail(f"arms.{i}.name", f"'{a.name}' is a built-in arm (prefix caching {a.name}); give yours another name")
        if a.name in seen:
            fail(f"arms.{i}.name", f"duplicate arm name '{a.name}'")
        seen.add(a.name)
    names = [*BUILTIN_ARMS, *(a.name for a in cfg.arms)]
    for m in cfg.sweep.modes:
        if m not in names:
            fail("sweep.modes", f"'{m}' is not an arm (on, off{''.join(', ' + a.name for a in cfg.arms)})")
    base = cfg.sweep.baseline
    if base is not None and base not in cfg.sweep.modes:
        fail("sweep.baseline", f"'{base}' is not one of the arms run (sweep.modes: {', '.join(cfg.sweep.modes)})",
             "sweep.modes")
    kind = cfg.engine.kind
    fields = set(type(cfg.engine).model_fields)
    for i, a in enumerate(cfg.arms):
        if "kind" in a.engine:
            fail(f"arms.{i}.engine.kind", f"the arms share the study's engine.kind ({kind}); an arm overlays its fields")
        if "prefix_caching" in a.engine:
            fail(f"arms.{i}.engine.prefix_caching", f"set it on the arm (arms.{i}.prefix_caching)")
        for k in a.engine:
            if k not in fields:
                fail(f"arms.{i}.engine.{k}", f"engine.kind {kind} has no such field")
        if not capabilities(kind).arm_overlays and (a.engine or a.offload):
            fail(f"arms.{i}", f"engine.kind {kind} runs the study's engine for every arm; an overlay needs a "
                              f"backend that starts one per arm ({', '.join(kinds_that('arm_overlays'))})")
        if a.offload is not None:
            _check_offload(cfg, i, a, fail)
        try:
            arm_engine(cfg.engine, a)
        except ValidationError as err:
            e = err.errors()[0]
            loc = ".".join(str(x) for x in e["loc"])
            fail(f"arms.{i}.engine.{loc}", "unknown key" if e["type"] == "extra_forbidden" else e["msg"])


# Offload backends vLLM accepts but a study cannot measure, and why.  vLLM (0.26 on) maps
# kv_offloading_backend lmcache to its LMCacheMPConnector, a client of a separate LMCache server:
# prefixstudy starts no such server, cannot reset its cache between points (so a point could start
# warm) and reads per-tier hits only from vLLM's own OffloadingConnector (engines.vllm_tiers).
UNSUPPORTED_OFFLOAD = {"lmcache": "lmcache is vLLM's LMCacheMPConnector, a client of a separate LMCache server "
                                  "that a study neither starts nor resets between points, and whose tier hits it "
                                  "cannot count; use native (vLLM's OffloadingConnector)"}


def _check_offload(cfg: StudyConfig, i: int, a: ArmConfig, fail) -> None:
    kind = cfg.engine.kind
    if not capabilities(kind).cpu_tier:
        fail(f"arms.{i}.offload", f"engine.kind {kind} has no CPU tier to set (one of: {', '.join(kinds_that('cpu_tier'))})")
    if not a.prefix_caching:
        fail(f"arms.{i}.offload", "a CPU tier extends the prefix cache; this arm has prefix_caching off")
    given = {**cfg.engine.extra_args, **a.engine.get("extra_args", {})}
    for k in OFFLOAD_ARGS:
        if k in given:
            fail(f"arms.{i}.offload", f"extra_args also sets {k}; set the tier in one place (arms.{i}.offload)")
    if a.offload.backend in UNSUPPORTED_OFFLOAD:
        fail(f"arms.{i}.offload.backend", UNSUPPORTED_OFFLOAD[a.offload.backend])
    pkg = OFFLOAD_PACKAGES[a.offload.backend]
    if pkg is not None and not installed(pkg):
        fail(f"arms.{i}.offload.backend", f"{a.offload.backend} needs the {pkg} package, which is not installed "
                                          f"(pip install {pkg}); native is vLLM's own")
    if cfg.device == "cpu":
        fail(f"arms.{i}.offload", "vLLM's KV offloading connector runs on CUDA, ROCm or XPU, not on the CPU "
                                  "(device: cpu)")
