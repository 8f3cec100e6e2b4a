"""Where the engines live.  ``local``: in this process, one mode after the other.
``ray``: in Ray actors (prefixstudy.ray_executor).  ``auto``: ray when it can be imported, else local."""

from __future__ import annotations

import asyncio

from tqdm import tqdm

from prefixstudy.config import StudyConfig


class LocalExecutor:
    name = "local"

    def run(self, cfg: StudyConfig, rows, writer, progress: bool = True) -> None:
        asyncio.run(self._run(cfg, rows, writer, progress))

    async def _run(self, cfg, rows, writer, progress) -> None:
        from prefixstudy.runner import ModeSession
        from prefixstudy.study import fmt_point, total_requests

        bar = tqdm(total=total_requests(cfg), unit="req", disable=not progress, dynamic_ncols=True)
        try:
            for mode in cfg.sweep.modes:
                bar.set_description(f"starting engine (cache {mode.upper()})")
                async with ModeSession(cfg, mode, rows, progress=bar.update) as session:
                    for rate in cfg.sweep.rates:
                        bar.set_description(f"cache {mode.upper()} @ {rate:g} req/s")
                        res = await session.run_point(rate)
                        summary = writer.add(res)
                        bar.write(f"[{mode.upper():>3} {rate:>6g} req/s] {fmt_point(summary)}"
                                  + (f"  FAILED: {res.meta.get('error')}" if res.meta.get("status") == "failed" else ""))
                        if res.meta.get("status") == "failed" and session.engine.is_dead():
                            bar.set_description(f"restarting engine (cache {mode.upper()})")
                            await session.restart()
        finally:
            bar.close()


def resolve_executor(requested: str) -> str:
    """``auto`` becomes ``ray`` when ray imports, else ``local``; the others stay what they are."""
    if requested != "auto":
        return requested
    try:
        import ray  # noqa: F401
    except ImportError:
        return "local"
    return "ray"


def pick_executor(cfg: StudyConfig):
    if resolve_executor(cfg.executor) == "ray":
        from prefixstudy.ray_executor import RayExecutor

        return RayExecutor()
    return LocalExecutor()
