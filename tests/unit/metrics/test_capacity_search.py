"""The capacity search's decisions (metrics.capacity_search): exact rate sequences against a known
capacity, verdicts that flip at the bracket's ends, each way a search stops, the points' windows,
and capacity.csv's rows, including recorded verdicts that contradict one capacity."""

from __future__ import annotations

import math

import pytest

from prefixstudy.config import load_config
from prefixstudy.config.capacity_search import CapacitySearchConfig
from prefixstudy.errors import UserError
from prefixstudy.metrics.capacity_search import capacity_rows, ratio_bracket, search_arm, verdict

SPEC = CapacitySearchConfig()  # from 16 req/s, doubling, to a bracket 1.10 wide, two repeats at each end


def point(rate: float, repeat: int, outcome: str, arrival: float | None = None, achieved: float = math.nan) -> dict:
    """A recorded point (manifest entry and summary row) that was sustained, saturated, had failed
    requests, or failed; ``achieved``: its completions per second (none by default, so no ceiling
    guides the search)."""
    return {"mode": "on", "rate": rate, "repeat": repeat, "status": "failed" if outcome == "failed" else "ok",
            "saturated": outcome == "saturated", "n_failed": 3 if outcome == "errors" else 0, "n_unfinished": 0,
            "arrival_rate": rate if arrival is None else arrival, "achieved_rate": achieved,
            "saturation_reason": "completed 80% of arrivals in the window" if outcome == "saturated" else ""}


def drive(outcome, spec: CapacitySearchConfig = SPEC, ceiling: float = math.nan):
    """Run the search against ``outcome(rate, repeat)`` the way the study does, round by round; an
    overloaded point completes ``ceiling`` requests a second."""
    points: list[dict] = []
    for _ in range(100):
        s = search_arm("on", points, spec)
        if s.stopped:
            return s, points
        assert s.next_points, "a search that has not stopped asks for a point"
        points += [point(r, k, outcome(r, k), achieved=min(r, ceiling) if math.isfinite(ceiling) else math.nan)
                   for r, k in s.next_points]
    raise AssertionError("the search did not stop")


def ran(points) -> list[tuple[float, int]]:
    return [(p["rate"], p["repeat"]) for p in points]


def below(cap):
    return lambda r, k: "sustained" if r <= cap else "saturated"


def test_grows_on_the_grid_then_bisects_to_the_tolerance_then_confirms_both_ends():
    s, pts = drive(below(75))
    # doubling from 16 until 128 saturates; geometric midpoints at 3 significant digits: sqrt(64*128) = 90.5,
    # sqrt(64*90.5) = 76.1, sqrt(64*76.1) = 69.8; 76.1 / 69.8 = 1.09 <= 1.10; then a repeat at each end
    assert ran(pts) == [(16.0, 0), (32.0, 0), (64.0, 0), (128.0, 0), (90.5, 0), (76.1, 0), (69.8, 0),
                        (69.8, 1), (76.1, 1)]
    assert (s.lo, s.hi, s.stopped, s.width()) == (69.8, 76.1, "converged", 76.1 / 69.8)


def test_a_ceiling_at_the_capacity_brackets_it_in_two_probes_half_the_tolerance_apart():
    # 128 saturates completing 75/s: the rates 75 x 1.10^(-1/4) = 73.2 and 75 x 1.10^(1/4) = 76.8 next
    s, pts = drive(below(75), ceiling=75)
    assert ran(pts) == [(16.0, 0), (32.0, 0), (64.0, 0), (128.0, 0), (73.2, 0), (76.8, 0), (73.2, 1), (76.8, 1)]
    assert (s.lo, s.hi, s.stopped) == (73.2, 76.8, "converged")


def test_a_ceiling_above_the_capacity_walks_down_its_neighbours():
    # overloaded, the engine completes 79/s though it sustains only 75: 77.1 saturates, 73.5 is sustained
    s, pts = drive(below(75), ceiling=79)
    assert ran(pts)[4:] == [(77.1, 0), (73.5, 0), (73.5, 1), (77.1, 1)]
    assert (s.lo, s.hi, s.stopped) == (73.5, 77.1, "converged")
    assert SPEC.near_ceiling(79) == [77.1, 80.9, 73.5, 84.9, 70.1, 89.0]


def test_a_ceiling_below_the_bracket_leaves_it_to_bisection():
    # requests that time out in service lose their work: completions (60/s) under the sustained 64
    assert ran(drive(below(75), ceiling=60)[1])[4:7] == [(90.5, 0), (76.1, 0), (69.8, 0)]


def test_an_overloaded_point_that_lost_work_reports_a_ceiling_but_does_not_guide():
    # 128 saturated with requests unfinished: the time they spent in service was lost, so its 70/s
    # says little of the edge; the search bisects, and capacity.csv still reports the 70
    pts = [point(16, 0, "sustained"), point(32, 0, "sustained"), point(64, 0, "sustained"),
           {**point(128, 0, "saturated", achieved=70.0), "n_unfinished": 40}]
    s = search_arm("on", pts, SPEC)
    assert (s.next_points, s.ceiling(), math.isnan(s.ceiling(whole=True))) == ([(90.5, 0)], 70.0, True)
    assert capacity_rows({"on": s}, None)[0]["ceiling_req_s"] == 70.0


def test_below_an_unsustained_start_it_shrinks_on_the_grid():
    s, pts = drive(below(3))
    assert ran(pts)[:5] == [(16.0, 0), (8.0, 0), (4.0, 0), (2.0, 0), (2.83, 0)]
    assert (s.lo, s.hi, s.stopped) == (2.83, 3.08, "converged")


def test_the_range_ends_stop_the_search_after_confirming_the_end_reached():
    s, pts = drive(below(1e6))
    assert ran(pts)[-2:] == [(512.0, 0), (512.0, 1)] and (s.lo, s.hi, s.stopped) == (512.0, None, "max rate")
    s, pts = drive(below(0.1))
    assert ran(pts)[-2:] == [(0.5, 0), (0.5, 1)] and (s.lo, s.hi, s.stopped) == (None, 0.5, "min rate")


def test_a_sustained_end_that_flips_reopens_the_bisection_below_it():
    # 69.8's confirming repeat saturates: a tie, so a third repeat; it saturates too, so 69.8 is the
    # bracket's upper end now and the bisection goes on between 64 and 69.8
    s, pts = drive(lambda r, k: "saturated" if r > 75 or (r == 69.8 and k > 0) else "sustained")
    assert ran(pts)[7:] == [(69.8, 1), (76.1, 1), (69.8, 2), (64.0, 1)]  # 69.8 has its repeats: 2 of 3 saturated
    assert (s.lo, s.hi, s.stopped) == (64.0, 69.8, "converged")
    assert [p["repeat"] for p in pts if p["rate"] == 64.0] == [0, 1]  # the new end confirmed in its turn


def test_a_saturated_end_that_flips_by_majority_moves_the_bracket_up():
    # 76.1 sustains its second and third repeats: sustained by majority, so the bracket is [76.1, 90.5)
    s, pts = drive(lambda r, k: "sustained" if r <= 75 or (r == 76.1 and k > 0) else "saturated")
    assert ran(pts)[7:11] == [(69.8, 1), (76.1, 1), (76.1, 2), (83.0, 0)]
    assert (s.lo, s.hi, s.stopped) == (76.1, 83.0, "converged")


def test_failed_requests_are_not_sustained_and_a_failed_point_stops_the_arm():
    assert [verdict(point(10, 0, o)) for o in ("sustained", "saturated", "errors", "failed")] == \
        ["sustained", "saturated", "errors", "failed"]
    s, _ = drive(lambda r, k: "errors" if r > 40 else "sustained")
    assert (s.lo, s.hi) == (38.1, 41.5)
    s, pts = drive(lambda r, k: "failed" if r == 64 else "sustained")
    assert (s.stopped, ran(pts)) == ("failures", [(16.0, 0), (32.0, 0), (64.0, 0)])


def test_the_bracket_is_held_to_the_actual_arrival_rates_of_its_windows():
    pts = [point(16, 0, "sustained"), point(32, 0, "saturated"), point(22.6, 0, "sustained", 22.0),
           point(26.9, 0, "saturated", 27.5), point(24.7, 0, "sustained", 24.1)]
    s = search_arm("on", pts, SPEC)
    # offered 24.7 / 26.9 is 1.089 wide, but the arrivals were 24.1 and 27.5: 1.14, so it bisects on
    assert (s.lo, s.hi, s.arrival("lo"), s.arrival("hi"), s.next_points) == (24.7, 26.9, 24.1, 27.5, [(25.8, 0)])


@pytest.mark.parametrize(("rate", "repeat", "window"), [(16.0, 0, 15.0), (128.0, 0, 15.0), (4.0, 0, 15.0),
                                                        (0.5, 0, 15.0), (512.0, 0, 15.0), (90.5, 0, 60.0),
                                                        (16.0, 1, 60.0), (16.0, None, 60.0)])
def test_grid_points_run_short_windows_and_every_other_point_the_edge_window(rate, repeat, window):
    assert SPEC.window_s(rate, repeat) == window


def test_a_point_runs_its_window_of_arrivals_and_its_cap_leaves_room_for_it():
    cfg = load_config(None, {"sweep.capacity_search": {}, "sweep.num_requests": 20, "sweep.max_point_duration_s": 30})
    sw = cfg.sweep
    assert [sw.requests_for(r, k) for r, k in [(1.0, 0), (16.0, 0), (90.5, 0), (16.0, 1)]] == [20, 240, 5430, 960]
    assert sw.max_point_duration_s == 90.0  # 1.5 x the 60 s edge window, above the config's 30
    assert sw.rate_extent()[0] == 0.5 and sw.rate_extent()[-1] == 512.0


@pytest.mark.parametrize(("sets", "field"), [
    ({"sweep.slo": {"objectives": {"e2e_p90": 100}}}, "sweep"),
    ({"sweep.max_concurrency": 4}, "sweep"),
    ({"sweep.capacity_search.start_rate": 1000}, "sweep.capacity_search"),
    ({"sweep.capacity_search.growth": 1}, "sweep.capacity_search.growth")])
def test_a_search_it_cannot_run_is_refused_naming_the_field(sets, field):
    with pytest.raises(UserError, match=f"field '{field}'"):
        load_config(None, {"sweep.capacity_search": {}, **sets})


def rows_of(outcomes: dict[str, list[tuple[float, int, str, float]]], baseline="off") -> dict[str, dict]:
    found = {m: search_arm(m, [{**point(r, k, o, a, achieved=min(a, 74.0)), "mode": m} for r, k, o, a in pts], SPEC)
             for m, pts in outcomes.items()}
    return {r["mode"]: r for r in capacity_rows(found, baseline)}


def test_capacity_rows_give_each_end_its_evidence_and_the_ratio_its_bracket():
    rows = rows_of({"on": [(64, 0, "sustained", 63.0), (69.8, 0, "sustained", 69.0), (69.8, 1, "sustained", 70.5),
                           (76.1, 0, "saturated", 77.0), (76.1, 1, "saturated", 75.5)],
                    "off": [(22.6, 0, "sustained", 22.0), (22.6, 1, "sustained", 23.0), (24.7, 0, "errors", 24.5),
                            (24.7, 1, "saturated", 25.0)]})
    on, off = rows["on"], rows["off"]
    # each end: the fastest sustained window at the lower end, the slowest unsustained one at the upper
    assert (on["sustained_req_s"], on["saturated_req_s"], off["sustained_req_s"], off["saturated_req_s"]) == \
        (70.5, 75.5, 23.0, 24.5)
    assert on["bracket_width"] == 75.5 / 70.5
    assert (on["sustained_votes"], on["sustained_repeats"], on["saturated_votes"], on["saturated_repeats"]) == \
        (2, 2, 2, 2)
    assert on["ceiling_req_s"] == 74.0  # the most completions/s of a saturated point
    assert off["saturated_reasons"] == "3 failed, 0 unfinished requests | completed 80% of arrivals in the window"
    assert (on["ratio_lo"], on["ratio_hi"]) == (70.5 / 24.5, 75.5 / 23.0)
    assert on["ratio_vs_baseline"] == pytest.approx(math.sqrt(70.5 * 75.5 / (23.0 * 24.5)))
    assert math.isnan(off["ratio_vs_baseline"]) and on["contradictions"] == "" and on["baseline"] == "off"


def test_verdicts_that_contradict_one_capacity_are_named_not_dropped():
    # wrong data: 90.5 sustained above 76.1, which saturated in both repeats
    rows = rows_of({"on": [(64, 0, "sustained", 64.0), (128, 0, "saturated", 128.0), (90.5, 0, "sustained", 90.5),
                           (76.1, 0, "saturated", 76.1), (76.1, 1, "saturated", 76.1)]}, baseline=None)
    on = rows["on"]
    assert on["contradictions"] == "90.5 sustained above 76.1"
    assert (on["sustained_rate_req_s"], on["saturated_rate_req_s"]) == (64.0, 76.1)


def test_an_arm_without_an_upper_end_bounds_the_ratio_from_below_only():
    point_, lo, hi = ratio_bracket({"sustained_req_s": 512.0, "saturated_req_s": math.nan},
                                   {"sustained_req_s": 20.0, "saturated_req_s": 22.0})
    assert math.isnan(point_) and lo == 512.0 / 22.0 and hi == math.inf


def noisy_ends(arrivals: dict[tuple[float, int], float]) -> list[dict]:
    """OFF's points to a bracket between 24.7 (sustained) and 25.8 (saturated), offered 1.045
    apart (under sqrt(1.10)), each end's repeats with the given arrival rates."""
    pts = [(16, 0, "sustained", 16.0), (32, 0, "saturated", 32.0), (22.6, 0, "sustained", 22.6),
           (26.9, 0, "saturated", 26.9)]
    pts += [(r, k, "sustained" if r == 24.7 else "saturated", a) for (r, k), a in arrivals.items()]
    return [{**point(r, k, o, a), "mode": "off"} for r, k, o, a in pts]


def test_offered_ends_within_half_the_tolerance_repeat_then_stop_on_the_arrivals_noise():
    # their windows' arrivals came out 23.0 and 26.5 (1.15 apart): a rate between them would not
    # narrow what the arrivals' noise sets, so each end runs more repeats, to max_end_repeats (4)
    wide = {(24.7, 0): 23.0, (24.7, 1): 23.0, (25.8, 0): 26.5, (25.8, 1): 26.5}
    s = search_arm("off", noisy_ends(wide), SPEC)
    assert (s.lo, s.hi, s.stopped, s.next_points) == (24.7, 25.8, None, [(24.7, 2), (25.8, 2)])
    wide |= {(24.7, 2): 23.0, (24.7, 3): 23.0, (25.8, 2): 26.5, (25.8, 3): 26.5}
    s = search_arm("off", noisy_ends(wide), SPEC)
    assert (s.stopped, s.next_points, s.width()) == ("resolution", [], 26.5 / 23.0)
    # a third repeat at each end closer to its offered rate: 25.9 / 24.5 = 1.057, converged
    s = search_arm("off", noisy_ends({**dict(list(wide.items())[:4]), (24.7, 2): 24.5, (25.8, 2): 25.9}), SPEC)
    assert (s.stopped, s.next_points, s.arrival("lo"), s.arrival("hi")) == ("converged", [], 24.5, 25.9)


def test_windows_that_cross_fall_back_to_the_mean_and_are_named():
    # wrong data: a window at 24.7 sustained 26.0 req/s, one at 25.8 did not sustain 25.5
    s = search_arm("off", noisy_ends({(24.7, 0): 24.0, (24.7, 1): 26.0, (25.8, 0): 25.5, (25.8, 1): 26.5}), SPEC)
    assert s.crossed() and (s.arrival("lo"), s.arrival("hi")) == (25.0, 26.0)
    assert s.contradictions == ["a window at 24.7 sustained 26 req/s, one at 25.8 did not sustain 25.5"]
    row = capacity_rows({"off": s}, None)[0]
    assert row["contradictions"] == s.contradictions[0] and row["bracket_width"] == 26.0 / 25.0


def test_a_config_whose_end_repeats_undercut_its_confirmations_is_refused():
    with pytest.raises(UserError, match="max_end_repeats 1 must be at least confirm_repeats 2"):
        load_config(None, {"sweep.capacity_search": {"max_end_repeats": 1}})
