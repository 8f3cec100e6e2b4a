"""``prefixstudy simulate --capacity``: the capacity search through the simulator's executor, in
virtual time on the tiny Llama (vLLM's own scheduler, the unit step cost of test_simulate's
calibration): every round is simulated points of one run, and capacity.csv's ends are those points'
verdicts."""

from __future__ import annotations

import pandas as pd
import pytest
import yaml
from click.testing import CliRunner

from prefixstudy.cli import main
from tests.unit.sim.test_simulate import OVERRIDES, calibration  # noqa: F401 (calibration: a fixture)

pytestmark = pytest.mark.slow


def test_a_simulated_capacity_search_converges_on_its_simulated_points(calibration, tmp_path):  # noqa: F811
    cfg = {k: v for k, v in OVERRIDES.items() if k != "sweep.rates"}
    data: dict = {}
    for key, value in {**cfg, "out": str(tmp_path / "out"), "engine.max_num_seqs": 4, "dataset.output_len": 40,
                       "sweep.num_requests": 20}.items():
        *path, last = key.split(".")
        node = data
        for part in path:
            node = node.setdefault(part, {})
        node[last] = value
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(data))
    res = CliRunner().invoke(main, ["simulate", str(tmp_path / "c.yaml"), "--calibration", str(calibration),
                                    "--capacity", "--no-report", "--set", "sweep.capacity_search.short_window_s=2",
                                    "--set", "sweep.capacity_search.edge_window_s=4"])
    assert res.exit_code == 0, res.output
    run = next((tmp_path / "out" / "simtest").iterdir())
    cap = pd.read_csv(run / "capacity.csv").set_index("mode")
    s = pd.read_csv(run / "summary.csv")
    for arm, r in cap.iterrows():
        assert r["stopped"] == "converged" and r["bracket_width"] <= 1.10, r.to_dict()
        pts = s[s["mode"] == arm]
        lo, hi = (pts[pts["rate"] == r[c]] for c in ("sustained_rate_req_s", "saturated_rate_req_s"))
        assert len(lo) == len(hi) == 2  # each end confirmed by a second repeat
        assert not lo["saturated"].any() and hi["saturated"].all()
        # each end: its fastest sustained window, its slowest unsustained one (they do not cross here)
        assert r["sustained_req_s"] == lo["arrival_rate"].max() < hi["arrival_rate"].min() == r["saturated_req_s"]
    # ON computes 16 prompt tokens a request where OFF computes 64: it sustains at least OFF's rate
    assert cap.loc["on", "saturated_req_s"] >= cap.loc["off", "sustained_req_s"]
    ends = [x for x in res.output.splitlines() if x.startswith(("capacity ON", "capacity OFF", "capacity ratio"))]
    assert len(ends) == 3  # the console's last word: two arms, one ratio
