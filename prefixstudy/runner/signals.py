"""Stopping a run: SIGINT and SIGTERM taken by the event loop (``run_until_signal``), and whether
a stop was asked (``stop_requested``), so a request cancelled by a signal is told apart from one
a point's deadline cancelled."""

from __future__ import annotations

import asyncio
import signal
import threading

from prefixstudy.engines import pool as engine_pool


class Terminated(KeyboardInterrupt):
    """SIGTERM, delivered like Ctrl-C so the same cleanup runs (engines down, points flushed)."""

    signum = signal.SIGTERM


# The signal that asked this process to stop, while ``run_until_signal`` runs a loop (None: none).
# The runner's own cancellations (a point's deadline) leave it None, so a request cancelled by one
# becomes an "unfinished" row, while one cancelled by a signal lets the cancellation through.
_stop: dict[str, int | None] = {"signum": None}
RECANCEL_S = 0.5  # how often a stop is repeated while the main task has not ended


def stop_requested() -> bool:
    return _stop["signum"] is not None


def run_until_signal(main):
    """``asyncio.run(main)``, with SIGINT and SIGTERM taken by the loop (``add_signal_handler``):
    the first one cancels the main task, again every RECANCEL_S until it ends (a library that
    swallows one cancellation cannot keep the run going), and the run then raises
    KeyboardInterrupt (SIGINT) or ``Terminated`` (SIGTERM).  A handler that raised from inside
    the loop's select call instead could leave the loop half-stopped and the sweep running on.
    Off the main thread (a Ray actor's, a notebook's helper) signals are not the loop's to take."""
    pool = engine_pool.active()
    if pool is not None:  # its engines belong to its loop (engines.pool)
        return pool.run(main)
    if threading.current_thread() is not threading.main_thread():
        return asyncio.run(main)
    loop = asyncio.new_event_loop()
    task = loop.create_task(main)
    sigs = (signal.SIGINT, signal.SIGTERM)
    previous = {s: signal.getsignal(s) for s in sigs}
    _stop["signum"] = None

    def again() -> None:
        if not task.done():
            task.cancel()
            loop.call_later(RECANCEL_S, again)

    def on_signal(signum: int) -> None:
        first = _stop["signum"] is None
        _stop["signum"] = _stop["signum"] or signum
        if first:
            again()

    try:
        for s in sigs:
            loop.add_signal_handler(s, on_signal, s)
        try:
            result = loop.run_until_complete(task)
        except BaseException:
            if not stop_requested():
                raise
            result = None  # whatever the cancellation left behind, the signal is the reason to report
        if stop_requested():
            raise (Terminated() if _stop["signum"] == signal.SIGTERM else KeyboardInterrupt()) from None
        return result
    finally:
        try:
            _cancel_rest(loop)
        finally:
            for s in sigs:
                loop.remove_signal_handler(s)
                signal.signal(s, previous[s])  # remove_signal_handler would leave SIG_DFL
            loop.close()
            _stop["signum"] = None


def _cancel_rest(loop: asyncio.AbstractEventLoop) -> None:
    """What asyncio.run does at its end: cancel the tasks still open, let them finish, close the
    async generators."""
    rest = [t for t in asyncio.all_tasks(loop) if not t.done()]
    for t in rest:
        t.cancel()
    if rest:
        loop.run_until_complete(asyncio.gather(*rest, return_exceptions=True))
    loop.run_until_complete(loop.shutdown_asyncgens())
    loop.run_until_complete(loop.shutdown_default_executor())
