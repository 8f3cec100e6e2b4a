"""Integration: the simulator against the real tiny CPU engine.  The engine study (the shared
``tiny_study`` fixture) is both the calibration, its steps fit the step cost, and the truth: the
simulator replays the same config on the same arrival schedule and must predict each point's
mean E2E within 10 %, with the same prefix hits exactly.

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


def test_sim_predicts_the_cpu_engines_mean_e2e_within_10_percent(tiny_study, simulated):
    real = prefixstudy.load(tiny_study).summary.set_index(["mode", "rate"])
    sim = simulated.summary.set_index(["mode", "rate"])
    assert list(sim.index) == list(real.index) and list(sim.n_ok) == list(real.n_ok) == [8, 8, 8, 8]
    err = (sim.mean_e2e_ms / real.mean_e2e_ms - 1).abs()
    assert err.max() < 0.10, f"relative E2E error by point:\n{err}"


def test_sim_serves_the_same_prefix_hits_as_the_engine(simulated):
    r = simulated.measured
    # CPU block size 128, taken from the calibration study: floor(1198 / 128) * 128 = 1152
    assert r[r["mode"] == "on"]["num_cached_tokens"].tolist() == [1152] * 16
    assert r[r["mode"] == "off"]["num_cached_tokens"].tolist() == [0] * 16
