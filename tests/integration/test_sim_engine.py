"""Integration: the simulator against the real tiny CPU engine.  The engine study (the shared
``tiny_study`` fixture) is both the calibration, its steps fit the step cost, and the truth: the
simulator replays the same config on the same arrival schedule, must serve the same prefix hits
exactly, and predict each point's mean E2E within ``E2E_TOL``.

Why 25 % and not the 5-10 % the H200 studies show (experiments/results/sim-accuracy, with repeats):
a point here is 8 requests on a shared 2-core machine.  Request by request the simulation tracks
the engine closely (paired differences of 0-3 % of the mean, a fresh run 2026-12-01), but the ON and
OFF engines run one after the other, a minute apart, and this machine's speed drifts between them:
CI's run of d7b63ca read +13 and +4 % for ON and +32 and +21 % for OFF from one fit of both
engines' steps.  So each mode is simulated on a calibration of its own engine's steps, as a user
calibrates on the engine they simulate; 25 % still fails a simulator that loses the cache (ON
would read about +70 %), a cost term, or a unit.  The orderings below are the simulation's, on the
one fit the CLI uses, where no host transient can move them.

The calibration reads whatever step timing the study recorded: engine-timed steps where the
engine core records them, else the frontend gaps with idle steps filtered."""

import shutil

import pandas as pd
import pytest

import prefixstudy
from prefixstudy.config import load_config
from prefixstudy.study.simulate import simulate

pytestmark = [pytest.mark.engine, pytest.mark.alone]


@pytest.fixture(scope="module")
def simulated(tiny_study, tmp_path_factory):
    cfg = load_config(tiny_study / "config.yaml")
    return prefixstudy.load(simulate(cfg, tiny_study, out=tmp_path_factory.mktemp("sim")))


def own_calibration(study, mode: str, folder):
    """The study's folder with only ``mode``'s engine steps: a calibration of that engine alone."""
    folder.mkdir()
    for name in ("manifest.json", "config.yaml"):
        shutil.copy(study / name, folder / name)
    steps = pd.read_parquet(study / "iterations.parquet")
    steps[steps["mode"] == mode].to_parquet(folder / "iterations.parquet")
    return folder


E2E_TOL = 0.25


def test_sim_predicts_the_cpu_engines_mean_e2e(tiny_study, simulated, tmp_path):
    real = prefixstudy.load(tiny_study).summary.set_index(["mode", "rate"])
    sim = simulated.summary.set_index(["mode", "rate"])
    assert list(sim.index) == list(real.index) and list(sim.n_ok) == list(real.n_ok) == [8, 8, 8, 8]
    cfg = load_config(tiny_study / "config.yaml")
    own = []
    for mode in ("on", "off"):
        c = cfg.model_copy(deep=True)
        c.sweep.modes = [mode]
        cal = own_calibration(tiny_study, mode, tmp_path / f"cal-{mode}")
        own.append(prefixstudy.load(simulate(c, cal, out=tmp_path / f"sim-{mode}")).summary)
    own = pd.concat(own).set_index(["mode", "rate"])
    assert list(own.index) == list(real.index)
    err = (own.mean_e2e_ms / real.mean_e2e_ms - 1).abs()
    assert err.max() < E2E_TOL, f"relative E2E error by point, each mode on its own engine's steps:\n{err}"
    # What caching buys and what load costs, in the simulation on the one fit of both engines'
    # steps: ON below OFF at each rate (the engine: 134 vs 183 ms at 2 req/s), and OFF slower at
    # 8 req/s than at 2 (183 vs 270 ms).  ON's 8 requests barely overlap at either rate, so ON is
    # flat with the rate (133.7 and 133.5 ms on the engine) and is held to E2E_TOL above instead.
    # The engine's own E2E is not held to the orderings: ON's lead at 2 req/s is a quarter of
    # OFF's time, which a slowdown of the shared host during ON's points alone can erase (ON 430.6
    # against OFF 426.4 ms was read on a host about 3x slow).  What caching buys on the engine's
    # own clock, its prefill, is test_engine_study's claim.
    e = sim["mean_e2e_ms"]
    assert e["on", 2.0] < e["off", 2.0] and e["on", 8.0] < e["off", 8.0]
    assert e["off", 2.0] < e["off", 8.0]


def test_sim_serves_the_same_prefix_hits_as_the_engine(simulated):
    r = simulated.measured
    # CPU block size 128, taken from the calibration study: floor(1198 / 128) * 128 = 1152
    assert r[r["mode"] == "on"]["num_cached_tokens"].tolist() == [1152] * 16
    assert r[r["mode"] == "off"]["num_cached_tokens"].tolist() == [0] * 16
