"""The table of what vLLM's default engine's steps show beside the step-cost fit
(experiments/results/sim-accuracy/step-terms.md) is what h200-tp1's committed records give, through
experiments/sim/step_terms.py, and its numbers say what docs/simulator.md says of them."""

from __future__ import annotations

from tests.scripts import load_script


def _script():
    return load_script("experiments/sim/step_terms.py")


def test_step_terms_md_is_what_the_committed_records_give():
    mod = _script()
    assert mod.OUT.read_text() == mod.table()


def test_the_fit_prices_off_s_prompt_steps_long_and_on_s_high_load_decode_steps_long():
    mod = _script()
    b = mod.steps_of(mod.STUDY)
    pts = mod.by_point(b, mod.fit(b).predict(b)).set_index(["mode", "rate", "kind"])["err_pct"].round(1)
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
