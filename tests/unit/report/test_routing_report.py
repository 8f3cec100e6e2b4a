"""report.routing: routing.md, routing.html and the routing figures at a sweep's parent, on hand-made
runs with known latencies (exact table values), and ``routing_report`` on a real echo fleet sweep."""

from __future__ import annotations

import base64
import re

import pandas as pd
import pytest

from prefixstudy.metrics import replicas as rm
from prefixstudy.report.routing import write_routing_report
from prefixstudy.schema import typed_iterations, typed_requests

# Its module fixtures take seconds (studies, reports, venvs): the whole file runs in `make test`, not `make test-fast`.
pytestmark = pytest.mark.slow

STEMS = ("routing_e2e", "routing_hit_rate", "routing_imbalance", "routing_replicas")


def run(rates: dict[float, float], cached: list[int], saturated: set[float] = frozenset()):
    """One policy's run, mode ON, one repeat: at each rate four requests alternating over replicas
    0 and 1, every E2E ``rates[rate]`` ms; each request one 10 ms step on its replica."""
    req, its, summ = [], [], []
    for rate, e2e in rates.items():
        req.append(pd.DataFrame({
            "mode": "on", "rate": rate, "repeat": 0, "request_index": range(4), "replica": [0, 1, 0, 1],
            "prompt_tokens": 100, "output_tokens": 8, "num_cached_tokens": cached, "expected_cached_tokens": cached,
            "scheduled_s": [i / rate for i in range(4)], "sent_s": [i / rate for i in range(4)], "e2e_ms": e2e,
            "ttft_ms": 10.0, "tpot_ms": 2.0, "error": ""}))
        its.append(pd.DataFrame({"mode": "on", "rate": rate, "repeat": 0, "replica": [0, 1, 0, 1],
                                 "step_start_s": [i / rate for i in range(4)],
                                 "t_s": [i / rate + 0.01 for i in range(4)], "step_ms": 10.0}))
        summ.append({"mode": "on", "rate": rate, "repeat": 0, "arrival_rate": rate * 0.975,
                     "saturated": rate in saturated})
    return typed_requests(pd.concat(req, ignore_index=True)), typed_iterations(pd.concat(its)), pd.DataFrame(summ)


def runs() -> dict:
    return {"round_robin": run({4.0: 40.0, 8.0: 150.0}, [0, 96, 0, 96], saturated={8.0}),
            "prefix_affinity": run({4.0: 30.0, 8.0: 90.0}, [0, 96, 96, 96])}


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    runs_ = runs()
    table = rm.policy_table(runs_)
    per = pd.concat([rm.replica_table(r, i).assign(policy=p) for p, (r, i, _) in runs_.items()], ignore_index=True)
    parent = tmp_path_factory.mktemp("sweep")
    md = write_routing_report(parent, list(runs_), table, per, rm.replica_summary(runs_))
    return parent, md


def rows(page: str) -> list[str]:
    """The HTML's table rows, as '|'-joined cell texts, with a leading 'SAT|' for a shaded row."""
    out = []
    for cls, body in re.findall(r"<tr( class=\"sat\")?>(.*?)</tr>", page):
        cells = re.findall(r"<td>(.*?)</td>", body)
        if cells:
            out.append(("SAT|" if cls else "") + "|".join(cells))
    return out


def test_every_figure_is_on_disk_linked_from_the_md_and_embedded_in_the_html(written):
    parent, md = written
    assert md == parent / "routing.md"
    text, page = md.read_text(), (parent / "routing.html").read_text()
    assert text.startswith("# Routing: round_robin, prefix_affinity over 2 replicas\n")
    assert "<h1>Routing: round_robin, prefix_affinity over 2 replicas</h1>" in page
    for stem in STEMS:
        png, svg = parent / "plots" / f"{stem}.png", parent / "plots" / f"{stem}.svg"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and svg.read_text().lstrip().startswith("<?xml")
        assert f"](plots/{stem}.png)" in text and f"([SVG](plots/{stem}.svg))" in text
        assert f"<figure id='{stem}'><img" in page
        assert f"src='data:image/png;base64,{base64.b64encode(png.read_bytes()).decode('ascii')}'" in page


def test_the_policy_table_marks_the_saturated_point_as_a_bound(written):
    parent, md = written
    r = rows((parent / "routing.html").read_text())
    # policy, mode, rate, arrival_rate, hit rate measured / expected, mean E2E [lo, hi], TTFT, TPOT,
    # imbalance of requests / busy time, saturated share: sorted by rate, mode, policy.
    assert r[:4] == [
        "prefix_affinity|on|4|3.9|0.72|0.72|30|30|30|10|2|1|1|0",
        "round_robin|on|4|3.9|0.48|0.48|40|40|40|10|2|1|1|0",
        "prefix_affinity|on|8|7.8|0.72|0.72|90|90|90|10|2|1|1|0",
        "SAT|round_robin|on|⚠ 8|7.8|0.48|0.48|≥ 150|150|150|10|2|1|1|1"]
    assert "| round_robin | on | ⚠ 8 | 7.8 | 0.48 | 0.48 | ≥ 150 | 150 | 150 |" in md.read_text()


def test_the_verdicts_and_the_per_replica_summary(written):
    parent, md = written
    text, r = md.read_text(), rows((parent / "routing.html").read_text())
    assert ("- 4 req/s, cache ON: prefix_affinity's extra hits outweigh its imbalance: hit rate 0.720 vs 0.480, "
            "busy imbalance 1.00 vs 1.00, mean E2E 30.0 [30.0, 30.0] vs 40.0 [40.0, 40.0] ms") in text
    assert ("- 8 req/s, cache ON: prefix_affinity's extra hits outweigh its imbalance (saturated in some repeat)"
            in text)
    # policy, mode, rate, replica, repeats, routed, ok, hit rate, busy_s, mean E2E [lo, hi], saturated share
    summary = [x for x in r if x.count("|") == 12]
    assert summary == [
        "prefix_affinity|on|4|0|1|2|2|0.48|0.02|30|30|30|0", "prefix_affinity|on|4|1|1|2|2|0.96|0.02|30|30|30|0",
        "prefix_affinity|on|8|0|1|2|2|0.48|0.02|90|90|90|0", "prefix_affinity|on|8|1|1|2|2|0.96|0.02|90|90|90|0",
        "round_robin|on|4|0|1|2|2|0|0.02|40|40|40|0", "round_robin|on|4|1|1|2|2|0.96|0.02|40|40|40|0",
        "round_robin|on|8|0|1|2|2|0|0.02|150|150|150|0", "round_robin|on|8|1|1|2|2|0.96|0.02|150|150|150|0"]


def test_the_e2e_figure_draws_the_saturated_point_as_an_x_in_its_modes_colour():
    from prefixstudy.report.routing import e2e_by_policy

    ax = e2e_by_policy(rm.policy_table(runs()), ["round_robin", "prefix_affinity"]).axes[0]
    xs = [(tuple(ln.get_xdata()), tuple(ln.get_ydata()), ln.get_color()) for ln in ax.get_lines()
          if ln.get_marker() == "X" and len(ln.get_xdata())]
    assert xs == [((7.8,), (150.0,), "tab:blue")]  # round robin's 8 req/s: actual rate 7.8, a bound
    dots = sorted((ln.get_marker(), tuple(ln.get_ydata())) for ln in ax.get_lines() if ln.get_marker() in ("o", "s"))
    assert dots == [("o", (40.0,)), ("s", (30.0, 90.0))]  # a marker per policy: round robin o, affinity s


ECHO = {"engine": {"kind": "echo", "block_size": 16}, "executor": "local", "arrivals.process": "constant",
        "replicas": 2, "router.policies": ["round_robin", "prefix_affinity"], "router.load_bound": 10.0,
        "dataset.kind": "groups",
        "dataset.groups": 3, "dataset.prefix_len": 64, "dataset.suffix_len": 8, "dataset.output_len": 4,
        "sweep.num_requests": 12, "sweep.warmup_requests": 0, "sweep.rates": [50], "sweep.modes": ["on"]}


def test_routing_report_of_an_echo_fleet_sweep_writes_the_html_and_the_replica_summary(tmp_path):
    from prefixstudy.config import load_config
    from prefixstudy.report.routing import routing_report
    from prefixstudy.sweep.run_sweep import run_sweep

    parent = run_sweep(load_config(None, {**ECHO, "out": str(tmp_path / "s")}), run_dir=tmp_path / "s", progress=False)
    assert routing_report(parent) == parent / "routing.md"
    s = pd.read_csv(parent / "replicas_summary.csv")
    assert list(s.columns) == ["policy", "mode", "rate", "replica", "n_repeats", "n_routed", "n_ok", "n_failed",
                               "hit_rate_measured", "hit_rate_expected", "busy_s", "mean_e2e_ms", "mean_e2e_lo",
                               "mean_e2e_hi", "saturated_share"]
    routed = s.groupby("policy")["n_routed"].apply(sorted).to_dict()
    assert routed == {"round_robin": [6, 6], "prefix_affinity": [4, 8]}  # affinity: 3 groups on 2 replicas
    # Prompts of 72 tokens, 64 of them a group's prefix.  Affinity (load_bound 10: no spill, whatever
    # the timing) keeps each group on the replica its prime warmed: every request hits 64 / 72.  Round
    # robin scatters them: 3 of the 6 (group, replica) pairs were never primed, so 3 of 12 miss.
    assert s[s["policy"] == "prefix_affinity"]["hit_rate_measured"].tolist() == pytest.approx([8 / 9, 8 / 9])
    t = pd.read_csv(parent / "routing.csv").set_index("policy")
    assert t["hit_rate_measured"].to_dict() == pytest.approx({"round_robin": 2 / 3, "prefix_affinity": 8 / 9})
    assert t["requests_imbalance"].to_dict() == pytest.approx({"round_robin": 1.0, "prefix_affinity": 4 / 3})
    page = (parent / "routing.html").read_text()
    for stem in STEMS:
        assert (parent / "plots" / f"{stem}.png").is_file() and (parent / "plots" / f"{stem}.svg").is_file()
        assert f"<figure id='{stem}'>" in page
    assert "<h2>Per replica over its repeats</h2>" in page
