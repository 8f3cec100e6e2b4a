"""Executor ``local``: the engines in this process, one mode after the other."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tqdm import tqdm

from prefixstudy.executors import StudySink, point_line, repeat_tag, total_requests
from prefixstudy.runner import ModeSession, run_until_signal

if TYPE_CHECKING:
    from prefixstudy.config import StudyConfig


class LocalExecutor:
    name = "local"

    def run(self, cfg: "StudyConfig", rows, sink: StudySink, progress: bool = True) -> None:
        run_until_signal(self._run(cfg, rows, sink, progress))

    async def _run(self, cfg, rows, sink: StudySink, progress: bool) -> None:
        bar = tqdm(total=total_requests(cfg), unit="req", disable=not progress, dynamic_ncols=True)
        try:
            for mode in cfg.sweep.modes:
                bar.set_description(f"starting engine (cache {mode.upper()})")
                async with ModeSession(cfg, mode, rows, progress=bar.update) as session:
                    for rate, repeat in cfg.sweep.points():
                        bar.set_description(f"cache {mode.upper()} @ {rate:g} req/s" + repeat_tag(cfg, repeat))
                        res = await session.run_point(rate, repeat)
                        row = sink.point_done(res)
                        failed = row["status"] == "failed"
                        bar.write(point_line(mode, rate, row, row["error"] if failed else "", repeat_tag(cfg, repeat)))
                        if failed and session.engine.is_dead():
                            bar.set_description(f"restarting engine (cache {mode.upper()})")
                            await session.restart()
        finally:
            bar.close()
