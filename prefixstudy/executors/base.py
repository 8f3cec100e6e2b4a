"""Stage: executors.  What every executor shares: the protocols, which executor a config gets,
and the one console line a finished point gets."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from prefixstudy.engines.registry import capabilities

if TYPE_CHECKING:
    from prefixstudy.config import StudyConfig
    from prefixstudy.schema import PointResult
    from prefixstudy.workloads import DatasetRow


class StudySink(Protocol):
    run_dir: Path

    def point_done(self, res: "PointResult") -> dict:
        """Record a finished point (ok or failed); returns its summary row.  May raise StudyFailed."""

    def record(self, key: str, value: Any) -> None:
        """Put what the executor knows (its plan, the cluster) into the manifest, under ``key``."""

    def append(self, key: str, mode: str, value: Any) -> None:
        """Append to the manifest's list ``key.mode`` (e.g. each engine a mode started)."""


class Executor(Protocol):
    name: str

    def run(self, cfg: "StudyConfig", rows: "list[DatasetRow]", sink: StudySink, progress: bool = True) -> None: ...


def ray_installed() -> bool:
    from prefixstudy.errors import installed

    if not installed("ray"):  # not a bare /tmp/ray folder on sys.path either
        return False
    try:
        import ray  # noqa: F401
    except ImportError:
        return False
    return True


def resolve_executor(requested: str, engine_kind: str | None = None, address: str = "local") -> str:
    """``auto`` becomes ``ray`` when ray imports (``local`` for a backend that needs no GPU of a
    cluster, ``local_by_default`` in engines.registry, unless a Ray cluster ``address`` is named),
    else ``local``; the others stay what they are.  (echo under Ray, two rates: 54 s; local: 37 s.)"""
    if requested != "auto":
        return requested
    if engine_kind is not None and capabilities(engine_kind).local_by_default and address == "local":
        return "local"
    return "ray" if ray_installed() else "local"


def engines_run_here(cfg: "StudyConfig") -> bool:
    """Whether the engines run on this machine's devices: the local executor, or a Ray cluster this
    run starts here.  Not when it joins one (``ray.address``, or ``local`` with RAY_ADDRESS set, as
    inside a Ray job): a KubeRay head runs the driver and has no GPU, its workers have them."""
    if resolve_executor(cfg.executor, cfg.engine.kind, cfg.ray.address) != "ray":
        return True
    return cfg.ray.address == "local" and not os.environ.get("RAY_ADDRESS")


def interleaved(cfg: "StudyConfig") -> bool:
    """Whether the arms take turns point by point (``sweep.interleave_arms``), with more than one
    arm and one replica.  The local executor keeps every arm's engine up in this process; the Ray
    executor keeps every arm's actor up where the cluster places them all at once but cannot run
    them side by side (``ray_plan.plan_parallel``: side by side, the arms run each point in step)."""
    return cfg.sweep.interleave_arms and len(cfg.sweep.modes) > 1 and cfg.replicas == 1


def shares_one_device(cfg: "StudyConfig") -> bool:
    """Whether the arms' engines, kept up together, share this machine's one device: interleaved
    in this process.  A Ray run gives each engine resources of its own (its placement group)."""
    return interleaved(cfg) and resolve_executor(cfg.executor, cfg.engine.kind, cfg.ray.address) == "local"


def repeat_tag(cfg: "StudyConfig", repeat: int) -> str:
    """" (repeat 2/3)" on a study with repeats, "" otherwise."""
    return f" (repeat {repeat + 1}/{cfg.sweep.repeats})" if cfg.sweep.repeats > 1 else ""


def point_line(mode: str, rate: float, s: dict, error: str = "", tag: str = "") -> str:
    """The one console line a finished point gets."""
    def ms(v):
        return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.1f}"

    return (f"[{mode.upper():>3} {rate:>6g} req/s{tag}] ok {s.get('n_ok')}/{s.get('n_sent')}  "
            f"e2e {ms(s.get('mean_e2e_ms'))} ms  prefill {ms(s.get('mean_prefill_ms'))} ms  "
            f"hit {s.get('hit_rate_measured', float('nan')):.3f}"
            + ("  SATURATED" if s.get("saturated") and not error else "")  # a failed point is no bound
            + ("" if s.get("hit_rate_ok", True) else "  HIT-RATE MISMATCH")
            + (f"  EVICTION (cache holds {s['hit_rate_estimated']:.3f} of {s['hit_rate_expected']:.3f})"
               if s.get("hit_rate_estimated", 1.0) < s.get("hit_rate_expected", 0.0) - 0.001 else "")
            + (f"  FAILED: {error}" if error else ""))
