"""Integration: the simulator against the real tiny CPU engine.  The engine study (the shared
``tiny_study`` fixture) is both the calibration, its steps fit the step cost, and the truth: the
simulator replays the same config on the same arrival schedule, must serve the same prefix hits
exactly, and predict each point's mean E2E within ``E2E_TOL``.

Why 25 % and not the 5-10 % the H200 studies show (experiments/results/sim-accuracy, with repeats):
a point here is 8 requests, and ON's and OFF's engines share this machine's 2 cores, so one
engine's prefills slow the other's steps, which no per-engine step cost can see.  The measured
mean itself is that noisy: on a fresh clone (2026-11-30) OFF at 2 req/s had E2E 582 +- 128 ms
(SD), a standard error of 8 %, and the simulation read -10 % there and +10 % at ON 2 req/s (+0.7
and -1.9 % at 8 req/s).  A 10 % bound failed on that noise about one run in several; 25 % is three
standard errors, and still fails a simulator that loses the cache (ON would read about +70 %),
a cost term, or a unit.  The orderings below hold by wide margins and are exact.

The calibration reads whatever step timing the study recorded: engine-timed steps once the
engine core records them (issue 13), the frontend gaps with idle steps filtered until then."""

import pytest

import prefixstudy
from prefixstudy.config import load_config
from prefixstudy.sim.run import simulate

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def simulated(tiny_study, tmp_path_factory):
    cfg = load_config(tiny_study / "config.yaml")
    return prefixstudy.load(simulate(cfg, tiny_study, out=tmp_path_factory.mktemp("sim")))


E2E_TOL = 0.25


def test_sim_predicts_the_cpu_engines_mean_e2e(tiny_study, simulated):
    real = prefixstudy.load(tiny_study).summary.set_index(["mode", "rate"])
    sim = simulated.summary.set_index(["mode", "rate"])
    assert list(sim.index) == list(real.index) and list(sim.n_ok) == list(real.n_ok) == [8, 8, 8, 8]
    err = (sim.mean_e2e_ms / real.mean_e2e_ms - 1).abs()
    assert err.max() < E2E_TOL, f"relative E2E error by point:\n{err}"
    # What caching buys and what load costs, as the engine showed them: ON below OFF at each rate
    # (301 vs 582 ms at 2 req/s), and each mode slower at 8 req/s than at 2.
    for d in (real, sim):
        e = d["mean_e2e_ms"]
        assert e["on", 2.0] < e["off", 2.0] and e["on", 8.0] < e["off", 8.0]
        assert e["on", 2.0] < e["on", 8.0] and e["off", 2.0] < e["off", 8.0]


def test_sim_serves_the_same_prefix_hits_as_the_engine(simulated):
    r = simulated.measured
    # CPU block size 128, taken from the calibration study: floor(1198 / 128) * 128 = 1152
    assert r[r["mode"] == "on"]["num_cached_tokens"].tolist() == [1152] * 16
    assert r[r["mode"] == "off"]["num_cached_tokens"].tolist() == [0] * 16
