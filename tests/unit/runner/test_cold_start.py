"""Cold starts that are proven (runner.cold) on the echo backend: every point's reset is checked
by a probe, a reset (or a salt) that did not take fails the point with the probe's numbers, and
`sweep.cache_isolation: salt` isolates points without any reset."""

from __future__ import annotations

import numpy as np
import pytest

from prefixstudy.engines import RequestTrace
from prefixstudy.engines.echo import EchoEngine
from prefixstudy.results import load
from prefixstudy.runner.cold import PROBE_SEED, probe_prompt, verdict
from prefixstudy.study.orchestrate import run_study
from tests.unit.runner.test_runner import cfg_with

SWEEP = {"sweep.rates": [50, 100], "sweep.repeats": 2}
# Echo's 16-token blocks: the probe is 2 whole blocks and one token; its second send hits both.
PROBE = {"probe_prompt_tokens": 33, "probe_warm_cached_tokens": 32, "probe_cold_cached_tokens": 0}
NOT_RESET = ("cold-start probe: the prefix-cache reset did not take: a fresh 33-token probe hit 32 cached tokens "
             "before the reset and 32 after it (0 expected)")
NOT_SALTED = ("cold-start probe: the point's cache salt did not isolate it: a fresh 33-token probe hit 32 cached "
              "tokens under the previous salt and 32 after it (0 expected)")


def _probe(p: dict) -> dict:
    return {k: p.get(k) for k in ("cache_isolation", "cold_probe", *PROBE)}


def _run(tmp_path, **sets):
    return load(run_study(cfg_with(out=str(tmp_path), **{**SWEEP, **sets}), progress=False))


def test_every_reset_is_proven_cold_and_the_probe_is_no_measured_request(tmp_path):
    res = _run(tmp_path)
    pts = res.manifest["points"]
    assert res.manifest["status"] == "complete" and len(pts) == 8
    assert [_probe(p) for p in pts if p["mode"] == "on"] == [{"cache_isolation": "reset", "cold_probe": "cold",
                                                              **PROBE}] * 4
    assert [(p["cold_probe"], "probe_prompt_tokens" in p) for p in pts if p["mode"] == "off"] == \
        [("caching off", False)] * 4
    # Rows are the points' 6 measured and 1 warm-up requests, no probe; ON hits exactly its bound.
    assert len(res.requests) == 8 * 7
    m = res.measured
    assert m[m["mode"] == "on"]["num_cached_tokens"].tolist() == [32] * 24
    assert m[m["mode"] == "on"]["expected_cached_tokens"].tolist() == [32] * 24
    assert m[m["mode"] == "off"]["num_cached_tokens"].tolist() == [0] * 24


def test_a_reset_that_does_nothing_fails_the_point_with_the_probe_s_numbers(tmp_path, monkeypatch):
    async def no_reset(self):
        pass

    monkeypatch.setattr(EchoEngine, "reset_prefix_cache", no_reset)
    res = _run(tmp_path)
    pts = res.manifest["points"]
    assert res.manifest["status"] == "complete_with_failures"
    on = [p for p in pts if p["mode"] == "on"]
    assert [(p["status"], p["error"], p["cold_probe"]) for p in on] == [("failed", NOT_RESET, "warm")] * 4
    # The first point's probe hit 32 tokens before and after (the reset emptied nothing); later
    # points' probes are fresh tokens, so the same numbers again.
    assert [(p["probe_warm_cached_tokens"], p["probe_cold_cached_tokens"]) for p in on] == [(32, 32)] * 4
    assert [(p["status"], p["cold_probe"]) for p in pts if p["mode"] == "off"] == [("ok", "caching off")] * 4
    # Its planned requests are rows all the same, none sent.
    r = res.requests[res.requests["mode"] == "on"]
    assert len(r) == 4 * 6 and set(r["error"]) == {f"not sent: {NOT_RESET}"}
    assert res.summary.set_index(["mode", "rate", "repeat"]).loc[("on", 50.0, 0), "error"] == NOT_RESET


def test_salt_isolates_each_point_and_repeat_without_a_reset(tmp_path, monkeypatch):
    async def refuse(self):
        raise AssertionError("cache_isolation salt resets nothing")

    monkeypatch.setattr(EchoEngine, "reset_prefix_cache", refuse)
    res = _run(tmp_path, **{"sweep.cache_isolation": "salt"})
    pts = res.manifest["points"]
    assert res.manifest["status"] == "complete"
    assert [_probe(p) for p in pts if p["mode"] == "on"] == [{"cache_isolation": "salt", "cold_probe": "cold",
                                                              **PROBE}] * 4
    salts = [p["cache_salt"] for p in pts]
    assert len(set(salts)) == 8  # one per arm, point and repeat
    for p in pts:
        assert p["cache_salt"].startswith("prefixstudy-")
        assert f"-{p['mode']}-{p['rate']:g}-r{p['repeat']}-salt" in p["cache_salt"]
        assert len(p["cache_salt"]) <= 128 and not set("@/\\\x00") & set(p["cache_salt"])  # vLLM's rules
    # Primes and warm-ups went under the point's salt: ON's measured requests hit the prefix.
    m = res.measured
    assert m[m["mode"] == "on"]["num_cached_tokens"].tolist() == [32] * 24
    assert bool(res.summary["hit_rate_ok"].all())


def test_a_salt_the_engine_ignores_fails_the_point(tmp_path, monkeypatch):
    monkeypatch.setattr(EchoEngine, "set_cache_salt", lambda self, salt: None)
    res = _run(tmp_path, **{"sweep.cache_isolation": "salt", "sweep.rates": [50], "sweep.repeats": 1})
    on = [p for p in res.manifest["points"] if p["mode"] == "on"]
    assert [(p["status"], p["error"], p["cold_probe"]) for p in on] == [("failed", NOT_SALTED, "warm")]


def test_a_failed_probe_checks_nothing_and_the_point_runs_isolated(tmp_path, monkeypatch):
    async def refused(self, prompt_token_ids, request_id):
        return [RequestTrace(0.0, error="HTTP 500: out of cheese")]

    resets, reset = [], EchoEngine.reset_prefix_cache

    async def counted(self):
        resets.append(self.mode)
        await reset(self)

    monkeypatch.setattr(EchoEngine, "probe", refused)
    monkeypatch.setattr(EchoEngine, "reset_prefix_cache", counted)
    res = _run(tmp_path, **{"sweep.rates": [50], "sweep.repeats": 2})
    on = [p for p in res.manifest["points"] if p["mode"] == "on"]
    assert [(p["status"], p["cold_probe"], p["probe_error"], "probe_warm_cached_tokens" in p) for p in on] == \
        [("ok", "probe failed", "HTTP 500: out of cheese", False)] * 2
    assert sorted(resets) == ["off", "off", "on", "on"]  # each point still reset
    m = res.measured
    assert m[m["mode"] == "on"]["num_cached_tokens"].tolist() == [32] * 12 and bool(res.summary["hit_rate_ok"].all())


@pytest.mark.parametrize("warm, cold, expected", [
    ([32], [0], ("cold", "")),
    ([32, 48], [0, 0], ("cold", "")),  # a fleet: every replica checked
    ([0], [0], ("unverified", "")),  # the probe's hits cannot be seen: nothing proven either way
    ([None], [None], ("unverified", "")),  # not reported
    ([32, 0], [0, 0], ("unverified", "")),  # one replica's hits unseen
    ([32], [16], ("warm", "cold-start probe: the prefix-cache reset did not take: a fresh 33-token probe hit 32 "
                          "cached tokens before the reset and 16 after it (0 expected)")),
    ([32, 32], [0, 16], ("warm", "cold-start probe: the prefix-cache reset did not take: a fresh 33-token probe "
                                 "hit 32 cached tokens before the reset and 16 after it (0 expected)")),
    ([0], [16], ("warm", "cold-start probe: the prefix-cache reset did not take: a fresh 33-token probe hit 0 "
                         "cached tokens before the reset and 16 after it (0 expected)")),
])
def test_the_verdict_on_right_and_wrong_probes(warm, cold, expected):
    assert verdict("reset", 33, warm, cold) == expected


def test_the_probe_prompt_is_fresh_whole_blocks_and_one_token():
    first = probe_prompt(np.random.default_rng(PROBE_SEED), 16, 2048, 100, 32000, set())
    assert len(first) == 33 and all(100 <= t < 32000 for t in first)
    # A dataset row that starts like it: the next draw is taken instead.
    again = probe_prompt(np.random.default_rng(PROBE_SEED), 16, 2048, 100, 32000, {tuple(first[:16])})
    assert len(again) == 33 and again[:16] != first[:16]
    # Two blocks, a token and the output token do not fit a 33-token model: one block and a token.
    assert len(probe_prompt(np.random.default_rng(PROBE_SEED), 16, 34, 100, 32000, set())) == 33
    assert len(probe_prompt(np.random.default_rng(PROBE_SEED), 16, 33, 100, 32000, set())) == 17
