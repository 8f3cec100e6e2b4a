"""Stage: engines.  In-process engines kept across studies in one Python process.

Starting an engine is most of a short study's time: 30-80 s for the tiny model on a CPU, minutes
for a large model on a GPU.  Inside ``with EnginePool():`` (a notebook, a script that runs several
studies, the test session), a study whose engine arguments equal those of an engine an earlier
study left behind takes that engine instead of starting one, and gives it back at its end:

    with prefixstudy.EnginePool():
        run_study(cfg_a)   # starts ON and OFF
        run_study(cfg_b)   # same model and engine arguments, another workload: no start

What a kept engine carries over is its weights and compiled graphs, never its cache: the runner
resets the prefix cache before every point, and reads step records and cached-token counts from
marks it sets at the point's start.  An AsyncLLM belongs to the event loop it first ran on, so
every study inside the pool runs on the pool's own loop, in a thread of its own; the calling
thread waits for it, and Ctrl-C there cancels the study as it would without a pool.

Only engines that can say what they are (``pool_key``) are kept: in-process vLLM engines.  A
Ray actor's, a server's and a fleet's engines are started and stopped by the study as always."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
import time
from collections import OrderedDict
from typing import Any

log = logging.getLogger(__name__)

_active: list["EnginePool"] = []


def active() -> "EnginePool | None":
    return _active[-1] if _active else None


class EnginePool:
    """Engines left idle by finished studies, at most ``max_engines`` of them (each holds its KV
    cache's memory).  The engines it keeps are those with the arguments of the first
    ``max_engines`` it started; any other engine given back is stopped, whatever the order in which a
    study's arms (up together when they take turns) give theirs back."""

    def __init__(self, max_engines: int = 2):
        self.max_engines = max_engines
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="prefixstudy-engine-pool", daemon=True)
        self._thread.start()
        self._idle: OrderedDict[str, Any] = OrderedDict()
        self._owned: dict[int, str] = {}  # id(engine) -> key, for engines handed out by this pool
        self._kept: list[str] = []  # the keys of the first max_engines engines started: the ones kept
        self.starts = 0  # engines this pool started
        self.reuses = 0  # studies' engines served from the idle ones

    # ---------------------------------------------------------------- as a context
    def __enter__(self) -> "EnginePool":
        _active.append(self)
        return self

    def __exit__(self, *exc) -> None:
        _active.remove(self)
        self.close()

    @contextlib.contextmanager
    def active(self):
        """This pool serves the studies run inside the block; it stays open after it."""
        _active.append(self)
        try:
            yield self
        finally:
            _active.remove(self)

    def close(self) -> None:
        """Stop the idle engines and the pool's loop."""
        if self.loop.is_closed():
            return
        idle, self._idle = list(self._idle.values()), OrderedDict()
        for engine in idle:
            with contextlib.suppress(Exception):  # one engine's failed shutdown must not keep the others
                self.call(engine.shutdown)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=30)
        if not self.loop.is_running():
            self.loop.close()

    # ---------------------------------------------------------------- running studies
    def run(self, main):
        """Run coroutine ``main`` on the pool's loop; the calling thread waits.  KeyboardInterrupt
        (Ctrl-C, or a signal handler raising) cancels it, waits for its cleanup, and re-raises."""
        started: concurrent.futures.Future = concurrent.futures.Future()
        done: concurrent.futures.Future = concurrent.futures.Future()

        def begin() -> None:
            task = self.loop.create_task(main)
            task.add_done_callback(lambda _: done.set_result(None))
            started.set_result(task)

        self.loop.call_soon_threadsafe(begin)
        task = started.result()
        try:
            _wait(done)
        except KeyboardInterrupt:
            self.loop.call_soon_threadsafe(task.cancel)
            with contextlib.suppress(concurrent.futures.TimeoutError):
                _wait(done, 60)
            raise
        return task.result()

    def call(self, fn, *args):
        """A plain function on the pool's loop thread (an engine's shutdown touches its loop)."""
        async def _call():
            return fn(*args)

        return asyncio.run_coroutine_threadsafe(_call(), self.loop).result()

    # ---------------------------------------------------------------- engines
    @staticmethod
    def key(engine) -> str | None:
        return engine.pool_key()

    def owns(self, engine) -> bool:
        return id(engine) in self._owned

    async def take(self, engine):
        """``engine`` (built, not started) started, or an idle engine with the same key in its place."""
        key = self.key(engine)
        kept = self._idle.pop(key, None) if key is not None else None
        if kept is not None:
            kept.adopt(engine)
            self.reuses += 1
            log.info("engine %s: reusing the one an earlier study started in this process", kept.mode)
            self._owned[id(kept)] = key
            return kept
        await engine.start()
        self.starts += 1
        if key is not None:
            self._owned[id(engine)] = key
            if key not in self._kept and len(self._kept) < self.max_engines:
                self._kept.append(key)
        return engine

    def give_back(self, engine) -> None:
        """A study is done with ``engine``: kept idle for the next study, or stopped (dead, or the pool full)."""
        key = self._owned.pop(id(engine), None)
        if key is None or engine.is_dead() or key in self._idle or key not in self._kept:
            engine.shutdown()
            return
        self._idle[key] = engine


def _wait(fut: concurrent.futures.Future, timeout: float | None = None) -> None:
    """fut.result(timeout), waited on in short slices: a signal's Python handler (Ctrl-C's
    KeyboardInterrupt) runs only between them."""
    end = None if timeout is None else time.monotonic() + timeout
    while True:
        try:
            return fut.result(timeout=0.1)
        except concurrent.futures.TimeoutError:
            if end is not None and time.monotonic() > end:
                raise


async def start_engine(engine):
    """``engine`` started, by the active pool (which may hand back a kept one) or by itself."""
    pool = active()
    if pool is not None and asyncio.get_running_loop() is pool.loop and pool.key(engine) is not None:
        return await pool.take(engine)
    await engine.start()
    return engine


def stop_engine(engine) -> None:
    """The study is done with ``engine``: back to the pool that handed it out, else shut down."""
    pool = active()
    if pool is not None and pool.owns(engine):
        pool.give_back(engine)
    else:
        engine.shutdown()
