"""Stage: executors.  Where the sessions (an engine and the code that sends it requests) live.

``local``: in this process; with ``sweep.interleave_arms`` every arm's engine stays up and the arms
take turns point by point.  ``ray``: one Ray actor per mode, side by side when the cluster has room,
else taking turns point by point where it places every arm's actor at once.  ``auto``: ray when it
can be imported, else local (and local for an in-process stand-in such as echo).

An executor runs the points of a config and hands every ``PointResult`` to the study through a
``StudySink``; it never writes results or the manifest itself.  Its progress line per point
comes from the summary row the sink returns.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prefixstudy.executors.base import (Executor, StudySink, engines_run_here, interleaved, point_line, ray_installed,
                                        repeat_tag, resolve_executor)

if TYPE_CHECKING:
    from prefixstudy.config import StudyConfig

__all__ = ["Executor", "StudySink", "engines_run_here", "interleaved", "pick_executor", "point_line", "ray_installed",
           "repeat_tag", "resolve_executor"]


def pick_executor(cfg: "StudyConfig") -> Executor:
    if resolve_executor(cfg.executor, cfg.engine.kind, cfg.ray.address) == "ray":
        from prefixstudy.executors.ray import RayExecutor

        return RayExecutor()
    from prefixstudy.executors.local import LocalExecutor

    return LocalExecutor()
