"""The table of what vLLM's default engine's steps show beside the step-cost fit
(experiments/results/sim-accuracy/step-terms.md) is what h200-tp1's committed records give, through
experiments/sim/step_terms.py, and what those records show of the linear fit's misses."""

from __future__ import annotations

from tests.scripts import load_script


def _script():
    return load_script("experiments/sim/step_terms.py")


def test_step_terms_md_is_what_the_committed_records_give():
    mod = _script()
    assert mod.OUT.read_text() == mod.table()


def test_the_linear_fit_prices_off_s_prompt_steps_long_and_on_s_high_load_decode_steps_long():
    mod = _script()
    b = mod.steps_of(mod.STUDY)
    pts = mod.by_point(b, mod.fit_linear(b).predict(b)).set_index(["mode", "rate", "kind"])["err_pct"].round(1)
    assert (pts["off", 1.0, "prompt"], pts["off", 16.0, "prompt"]) == (15.5, 15.2)
    assert (pts["on", 56.0, "decode only"], pts["on", 96.0, "decode only"]) == (10.1, 17.6)
    # and within 5 % on every other decode-only group
    rest = pts.xs("decode only", level="kind").drop([("on", 56.0), ("on", 96.0)])
    assert rest.abs().max() == 4.4


def test_each_effect_is_two_groups_of_real_steps_and_its_size():
    mod = _script()
    e = {r["effect"]: r for r in mod.effects(mod.steps_of(mod.STUDY))}
    mixed = e["a decoder costs more in a step with a prompt"]
    assert (mixed["a"]["n"], mixed["b"]["n"]) == (590, 177)
    # A decoder in a step with one whole prompt costs 1.7x what it costs in a decode-only step at the
    # same two loads: the load alone does not make decoders dearer.
    assert (round(mixed["value"], 4), round(mixed["beside"], 4)) == (0.0934, 0.0555)
    second = e["a second prompt in a step costs more than the first"]
    assert (round(second["value"], 2), round(second["beside"], 2)) == (22.69, 26.98)
    shared = e["decoders that share a cached prefix cost less"]
    assert (shared["a"]["n"], shared["b"]["n"], round(shared["value"], 2)) == (65, 53, -2.18)
    idle = [e[f"the first step after an idle spell is slower ({m})"] for m in ("OFF", "ON")]
    assert [(r["a"]["n"], r["b"]["n"], round(r["value"], 2)) for r in idle] == [(22, 38, 3.52), (22, 38, 3.29)]


def test_the_gpu_waits_for_the_host_at_on_s_middle_loads_and_the_host_part_recovers_half():
    mod = _script()
    b = mod.steps_of(mod.STUDY)
    t = mod.loop_idle(b, mod.fit_linear(b, async_scheduling=True).host).set_index(["mode", "rate"]).round(2)
    assert (t.loc[("on", 32.0), "idle_pct"], t.loc[("on", 56.0), "idle_pct"]) == (3.11, 6.21)
    assert t.xs("off", level="mode")["idle_pct"].max() == 0.25
    assert (round(t.loc[("on", 32.0), "idle_per_new_ms"], 1), round(t.loc[("on", 56.0), "idle_per_new_ms"], 1)) == (0.9, 1.3)
    # max(measured GPU span, host part) against the loop: half the idle left at ON 56
    assert (t.loc[("on", 32.0), "priced_err_pct"], t.loc[("on", 56.0), "priced_err_pct"]) == (-1.48, -2.99)
    assert t.xs("off", level="mode")["priced_err_pct"].abs().max() <= 0.3
