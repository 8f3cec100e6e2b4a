"""Arms: the engines a study compares, each an overlay on the study's ``engine`` section.

    sweep:
      modes: [on, off, on-bs64, on-offload]   # the arms to run; unset: on, off and every arm below
      baseline: off                            # every other arm is compared with this one
    arms:
      - name: on-bs64                          # prefix caching on (default), block size 64
        engine: {block_size: 64}
      - name: on-offload                       # and a 32 GiB CPU tier (vLLM's OffloadingConnector)
        offload: {size_gib: 32, backend: native}

``on`` and ``off`` are built in: the study's engine with prefix caching on / off.  Every arm
replays the same dataset on the same arrival schedule (the schedule's seed never sees the arm), and
its name is the ``mode`` of its results.  An overlay names fields of the study's backend
(``engine.kind`` is the study's, one for all arms); a nested mapping (``extra_args``) is merged
into the study's, not replaced.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from prefixstudy.engines.base import caching  # noqa: F401 - the arms' view of it
from prefixstudy.errors import UserError, installed

if TYPE_CHECKING:
    from prefixstudy.config import StudyConfig

_STRICT = ConfigDict(extra="forbid")
NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"  # a mode: part of file names and request ids
# Backends whose engine arguments take a CPU tier, and the arguments it maps to (vLLM's
# OffloadingConnector: ``kv_offloading_size`` in GiB, ``kv_offloading_backend``).
OFFLOAD_KINDS = ("vllm", "vllm-server")
OFFLOAD_ARGS = ("kv_offloading_size", "kv_offloading_backend")
# The package each offload backend needs beyond vLLM (None: vLLM's own).
OFFLOAD_PACKAGES = {"native": None, "lmcache": "lmcache"}


class OffloadConfig(BaseModel):
    """A CPU tier under the GPU prefix cache."""

    model_config = _STRICT
    size_gib: float = Field(gt=0, description="The tier's size, GiB of host memory (vLLM's `kv_offloading_size`).")
    backend: Literal["native", "lmcache"] = Field("native", description="vLLM's `kv_offloading_backend`: `native` "
                                                  "(its OffloadingConnector) or `lmcache` (needs that package).")


class ArmConfig(BaseModel):
    model_config = _STRICT
    name: str = Field(pattern=NAME, description="The arm's name: the `mode` of its rows and part of file names "
                      "(not `on` or `off`).")
    prefix_caching: bool = Field(True, description="Prefix caching on this arm's engine.")
    engine: dict[str, Any] = Field(default_factory=dict, description="Fields of the study's `engine` section this "
                                   "arm overrides (`extra_args` is merged); empty: the study's engine.")
    offload: OffloadConfig | None = Field(None, description="A CPU tier under the prefix cache (vllm, vllm-server "
                                          "on a GPU); None: none.")


BUILTIN_ARMS = {"on": ArmConfig(name="on"), "off": ArmConfig(name="off", prefix_caching=False)}


def compared(arms: Sequence[str], baseline: str | None) -> tuple[str, str]:
    """The two arms headline.csv and the report's first screen compare: the first arm other than
    the baseline, and the baseline (``sweep.baseline``; off when it runs).  ON and OFF where there is
    no baseline or no other arm ran: their columns then hold what of them ran, with no gain."""
    other = [a for a in arms if a != baseline]
    return (other[0], baseline) if baseline is not None and other else ("on", "off")


def arm_label(arm: str) -> str:
    """An arm's name in text: ON / OFF for the built-in ones, a study's own as it named it."""
    return arm.upper() if arm in BUILTIN_ARMS else arm


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = {**out[k], **v} if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def overlay_data(engine, arm: ArmConfig) -> dict:
    """The arm's engine section as data: the study's, the arm's overlay merged in, its tier mapped
    to engine arguments."""
    data = _merge(engine.model_dump(exclude_unset=False), arm.engine)
    if arm.offload is not None:
        tier = {"kv_offloading_size": arm.offload.size_gib, "kv_offloading_backend": arm.offload.backend}
        data["extra_args"] = {**data.get("extra_args", {}), **tier}
    return data


def arm_engine(engine, arm: ArmConfig):
    """The engine config one arm's engine is built from (its ``prefix_caching`` set)."""
    if not arm.engine and arm.offload is None:
        out = engine.model_copy(deep=True)
    else:
        out = type(engine).model_validate(overlay_data(engine, arm))
    out.prefix_caching = arm.prefix_caching
    return out


def _source(source: str, overrides: dict | None, *fields: str) -> str:
    for k in overrides or ():
        if any(f == k or f.startswith(f"{k}.") or k.startswith(f"{f}.") for f in fields):
            return f"--set {k}" if k != "sweep.modes" else "--modes/--set sweep.modes"
    return source


def check_arms(cfg: "StudyConfig", source: str, overrides: dict | None = None) -> None:
    """Refuse, in one line naming the field, an arm config that cannot mean what it says."""
    def fail(field: str, msg: str, *origin: str) -> None:
        raise UserError(f"{_source(source, overrides, field, *origin)}: field '{field}': {msg}")

    if cfg.engine.prefix_caching is not None:
        fail("engine.prefix_caching", "caching is set per arm (sweep.modes on / off, or arms[].prefix_caching)")
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
    fields = set(type(cfg.engine).model_fields) - {"prefix_caching"}
    for i, a in enumerate(cfg.arms):
        if "kind" in a.engine:
            fail(f"arms.{i}.engine.kind", f"the arms share the study's engine.kind ({kind}); an arm overlays its fields")
        if "prefix_caching" in a.engine:
            fail(f"arms.{i}.engine.prefix_caching", f"set it on the arm (arms.{i}.prefix_caching)")
        for k in a.engine:
            if k not in fields:
                fail(f"arms.{i}.engine.{k}", f"engine.kind {kind} has no such field")
        if kind == "sim" and (a.engine or a.offload):
            fail(f"arms.{i}", "engine.kind sim simulates the study's engine for every arm; an overlay needs a "
                              "backend that starts engines (vllm, vllm-server, echo, http)")
        if a.offload is not None:
            _check_offload(cfg, i, a, fail)
        try:
            arm_engine(cfg.engine, a)
        except ValidationError as err:
            e = err.errors()[0]
            loc = ".".join(str(x) for x in e["loc"])
            fail(f"arms.{i}.engine.{loc}", "unknown key" if e["type"] == "extra_forbidden" else e["msg"])


def _check_offload(cfg: "StudyConfig", i: int, a: ArmConfig, fail) -> None:
    kind = cfg.engine.kind
    if kind not in OFFLOAD_KINDS:
        fail(f"arms.{i}.offload", f"engine.kind {kind} has no CPU tier to set (one of: {', '.join(OFFLOAD_KINDS)})")
    if not a.prefix_caching:
        fail(f"arms.{i}.offload", "a CPU tier extends the prefix cache; this arm has prefix_caching off")
    given = {**cfg.engine.extra_args, **a.engine.get("extra_args", {})}
    for k in OFFLOAD_ARGS:
        if k in given:
            fail(f"arms.{i}.offload", f"extra_args also sets {k}; set the tier in one place (arms.{i}.offload)")
    pkg = OFFLOAD_PACKAGES[a.offload.backend]
    if pkg is not None and not installed(pkg):
        fail(f"arms.{i}.offload.backend", f"{a.offload.backend} needs the {pkg} package, which is not installed "
                                          f"(pip install {pkg}); native is vLLM's own")
    if cfg.device == "cpu":
        fail(f"arms.{i}.offload", "vLLM's KV offloading connector runs on CUDA, ROCm or XPU, not on the CPU "
                                  "(device: cpu)")


def check_offload_device(cfg: "StudyConfig", device: str | None = None) -> None:
    """An offload arm where the engines run on the CPU: refused before anything starts.  ``device``:
    where they run; None: this machine's, when they run here (``executors.engines_run_here``; a
    cluster's nodes are not known before it is joined)."""
    tiers = [(i, a) for i, a in enumerate(cfg.arms) if a.offload is not None and a.name in cfg.sweep.modes]
    if not tiers:
        return
    if device is None:
        from prefixstudy.executors import engines_run_here
        from prefixstudy.results.provenance import device_name

        if not engines_run_here(cfg):
            return

        device = cfg.device if cfg.device != "auto" else ("cpu" if device_name() == "cpu" else "cuda")
    for i, a in tiers:
        if device == "cpu":
            raise UserError(f"field 'arms.{i}.offload': vLLM's KV offloading connector runs on CUDA, ROCm or XPU; "
                            f"this machine's engines run on the CPU (arm {a.name})")
