"""Stage: executors.  Where the sessions (an engine and the code that sends it requests) live.

``local``: in this process, one mode after the other.  ``ray``: one Ray actor per mode, side by
side when the cluster has room.  ``auto``: ray when it can be imported, else local (and local for
an in-process stand-in such as echo).

An executor runs the points of a config and hands every ``PointResult`` to the study through a
``StudySink``; it never writes results or the manifest itself.  Its progress line per point
comes from the summary row the sink returns.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

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


# Backends whose engine needs no GPU of this cluster: echo runs in this process (two echo rates:
# 54 s under Ray, 37 s local), and http measures a server that runs elsewhere, so a local Ray
# cluster would only add its start and its processes.  ``auto`` keeps them local unless a cluster
# is named.
LOCAL_BY_DEFAULT = ("echo", "http")


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
    """``auto`` becomes ``ray`` when ray imports (``local`` for the ``LOCAL_BY_DEFAULT`` kinds,
    unless a Ray cluster ``address`` is named), else ``local``; the others stay what they are."""
    if requested != "auto":
        return requested
    if engine_kind in LOCAL_BY_DEFAULT and address == "local":
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
    """Whether the arms take turns point by point (``sweep.interleave_arms``): in process, with more
    than one arm and one replica.  A Ray run's arms go side by side on their own GPUs, or one after
    the other."""
    return (cfg.sweep.interleave_arms and len(cfg.sweep.modes) > 1 and cfg.replicas == 1
            and resolve_executor(cfg.executor, cfg.engine.kind, cfg.ray.address) == "local")


def pick_executor(cfg: "StudyConfig") -> Executor:
    if resolve_executor(cfg.executor, cfg.engine.kind, cfg.ray.address) == "ray":
        from prefixstudy.executors.ray import RayExecutor

        return RayExecutor()
    from prefixstudy.executors.local import LocalExecutor

    return LocalExecutor()


def total_requests(cfg: "StudyConfig") -> int:
    per_mode = sum(cfg.sweep.requests_for(r) for r, _ in cfg.sweep.points())
    return per_mode * len(cfg.sweep.modes)


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
