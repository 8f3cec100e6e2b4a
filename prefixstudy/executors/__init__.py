"""Stage: executors.  Where the sessions (an engine and the code that sends it requests) live.

``local``: in this process, the arms taking turns point by point.  ``ray``: one Ray actor per
mode, side by side when the cluster has room.  ``auto``: ray when it can be imported, else local
(and local for an in-process stand-in such as echo, and for vLLM in process where this machine
has fewer GPUs than arms: ``executor_of``).

An executor runs the points of a config and hands every ``PointResult`` to the study through a
``StudySink``; it never writes results or the manifest itself.  Its progress line per point
comes from the summary row the sink returns.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from prefixstudy.executors.base import (Executor, StudySink, engines_run_here, executor_of, interleaved, point_line,
                                        ray_installed, repeat_tag, resolve_executor)

if TYPE_CHECKING:
    from prefixstudy.config import StudyConfig

__all__ = ["Executor", "StudySink", "engines_run_here", "executor_of", "interleaved", "pick_executor", "point_line",
           "ray_installed", "repeat_tag", "resolve_executor"]


def pick_executor(cfg: "StudyConfig") -> Executor:
    if executor_of(cfg) == "ray":
        from prefixstudy.executors.ray import RayExecutor

        return RayExecutor()
    from prefixstudy.executors.local import LocalExecutor

    return LocalExecutor()
