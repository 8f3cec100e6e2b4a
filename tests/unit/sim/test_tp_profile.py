"""The TP shard profile's table (experiments/results/h200-tp-shard-profile/ratios.md) is what the
committed profile runs and studies give, through experiments/sim/tp_profile.py."""

from __future__ import annotations


import pytest

from tests.scripts import load_script


pytestmark = pytest.mark.slow  # two step-cost fits over the committed studies' steps


def _script():
    return load_script("experiments/sim/tp_profile.py")


def test_ratios_md_is_what_the_committed_files_give():
    mod = _script()
    assert (mod.PROFILE / "ratios.md").read_text() == mod.table()


def test_the_prefill_gemms_explain_most_of_the_fitted_prefill_cost_at_both_degrees():
    mod = _script()
    ms = mod.profile_ms(mod.PROFILE)
    assert len(list(mod.PROFILE.glob("tp_shard_profile*.json"))) == 4
    # Mistral-7B: 32 layers, hidden 4096; the datasheet's 450 GB/s NVLink a direction.
    tp1, tp2 = (mod.prefill_ms_per_token(ms, tp, 32, 4096, 450) for tp in (1, 2))
    assert (round(tp1, 5), round(tp2, 5)) == (0.01979, 0.01185)
    # Sharding halves the FLOPs; the profile's GEMMs lose a little efficiency and pay the all-reduce.
    assert 0.5 < tp2 / tp1 < 0.62
