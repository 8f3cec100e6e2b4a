"""Executor ``local``: the engines in this process.  With more than one arm and
``sweep.interleave_arms`` every arm's engine stays up and the arms take turns point by point
(``RunPlan.turns``: A B, B A, ...), so that the arm is not confounded with the time or the
order it ran in; otherwise one arm's whole sweep runs after another's.  Each engine warms up
until its step time settles before its first point (``runner.warmup``)."""

from __future__ import annotations

import contextlib
import logging
import os
from typing import TYPE_CHECKING

from tqdm import tqdm

from prefixstudy.executors.base import StudySink, interleaved, point_line, repeat_tag
from prefixstudy.runner import ModeSession, run_until_signal
from prefixstudy.runner.warmup import note as warmup_note

if TYPE_CHECKING:
    from prefixstudy.config import StudyConfig
    from prefixstudy.executors.run_plan import RunPlan


log = logging.getLogger(__name__)


class LocalExecutor:
    name = "local"

    def run(self, cfg: "StudyConfig", plan: "RunPlan", rows, sink: StudySink, progress: bool = True) -> None:
        run_until_signal(self._run(cfg, plan, rows, sink, progress))

    async def _run(self, cfg, plan: "RunPlan", rows, sink: StudySink, progress: bool) -> None:
        bar = tqdm(total=plan.requests(cfg), unit="req", disable=not progress, dynamic_ncols=True)
        try:
            if interleaved(cfg):
                await self._turns(cfg, plan, rows, sink, bar)
                return
            last = cfg.sweep.modes[-1]
            for mode in cfg.sweep.modes:
                bar.set_description(f"starting engine (cache {mode.upper()})")
                async with ModeSession(cfg, mode, rows, progress=bar.update) as session:
                    engine_started(session, sink)
                    for rate, repeat in plan.of(mode):
                        await self._point(cfg, session, rate, repeat, sink, bar)
                    if mode == last:  # a search's next rounds that need this arm alone, on its engine
                        await self._later_rounds({mode: session}, sink, bar)
        finally:
            bar.close()

    async def _turns(self, cfg, plan: "RunPlan", rows, sink: StudySink, bar) -> None:
        async with contextlib.AsyncExitStack() as stack:
            sessions = {}
            for mode in cfg.sweep.modes:  # every engine up before the first point is measured
                bar.set_description(f"starting engine (cache {mode.upper()})")
                sessions[mode] = await stack.enter_async_context(ModeSession(cfg, mode, rows, progress=bar.update))
                engine_started(sessions[mode], sink)
            for mode, rate, repeat in plan.turns(cfg):
                await self._point(cfg, sessions[mode], rate, repeat, sink, bar)
            await self._later_rounds(sessions, sink, bar)

    async def _later_rounds(self, sessions: dict[str, ModeSession], sink: StudySink, bar) -> None:
        """A search's next rounds on the engines still up (``sessions``), as long as it needs no other
        arm: an engine start per round would cost more than its points."""
        take_round = getattr(sink, "take_round", None)
        while take_round is not None and (work := take_round(list(sessions))) is not None:
            cfg, plan = work
            bar.total += plan.requests(cfg)
            bar.refresh()
            for mode, rate, repeat in plan.turns(cfg):
                await self._point(cfg, sessions[mode], rate, repeat, sink, bar)

    @staticmethod
    async def _point(cfg, session: ModeSession, rate: float, repeat: int, sink: StudySink, bar) -> None:
        mode = session.mode
        bar.set_description(f"cache {mode.upper()} @ {rate:g} req/s" + repeat_tag(cfg, repeat))
        res = await session.run_point(rate, repeat)
        row = sink.point_done(res)
        failed = row["status"] == "failed"
        bar.write(point_line(mode, rate, row, row["error"] if failed else "", repeat_tag(cfg, repeat)))
        if failed and session.engine.is_dead():
            bar.set_description(f"restarting engine (cache {mode.upper()})")
            await session.restart()
            engine_started(session, sink)


def engine_started(session: ModeSession, sink: StudySink) -> None:
    """The manifest's ``engines`` entry of an engine that started (and warmed up), and the console
    note of a warm-up that did not settle."""
    eng = session.engine
    sink.append("engines", session.mode, {"pid": os.getpid(), "startup_s": eng.startup_s,
                                          "block_size": eng.block_size, "warmup": session.warmup})
    if note := warmup_note(session.mode, session.warmup):
        with tqdm.external_write_mode():  # its own line, not the progress bar's
            log.warning("%s", note)
