"""Arms (prefixstudy.config.arms) on the echo backend: the config, the overlay each arm's engine is built
from, one schedule for every arm, results named by arm, arms.csv against the baseline, and colours.

The echo backend keeps a real block cache, so an arm's block size shows in its hit rate exactly:
64-token prompts (56 shared + 8 unique), whole blocks only, never the last token: 16-token blocks
serve 48 tokens (0.75), 32-token blocks 32 (0.5), OFF none.
"""

from __future__ import annotations

import pandas as pd
import pytest

from prefixstudy.config.arms import arm_engine, caching
from prefixstudy.config import load_config, parse_config
from prefixstudy.errors import UserError
from prefixstudy.results import load
from prefixstudy.study.orchestrate import run_study

# Its module fixtures take seconds (studies, reports, venvs): the whole file runs in `make test`, not `make test-fast`.
pytestmark = pytest.mark.slow

ECHO = {"engine": {"kind": "echo", "block_size": 16, "decode_ms_per_token": 0.2}, "executor": "local",
        "arrivals.process": "constant", "dataset.prefix_len": 56, "dataset.suffix_len": 8, "dataset.output_len": 4,
        "dataset.groups": 2, "sweep.num_requests": 8, "sweep.warmup_requests": 1, "sweep.rates": [40, 80]}
BS32 = [{"name": "on-bs32", "engine": {"block_size": 32}}]


def cfg_with(**sets):
    return load_config(None, {**ECHO, **sets})


def test_without_arms_a_study_runs_on_and_off_against_off():
    cfg = cfg_with()
    assert cfg.sweep.modes == ["on", "off"]
    assert cfg.sweep.baseline_arm() == "off"
    assert [caching(cfg.arm_engine(m), m) for m in cfg.sweep.modes] == [True, False]
    assert cfg_with(**{"sweep.modes": ["on"]}).sweep.baseline_arm() is None  # nothing to compare with


def test_arms_run_after_on_and_off_unless_modes_names_them():
    assert cfg_with(arms=BS32).sweep.modes == ["on", "off", "on-bs32"]
    assert cfg_with(arms=BS32, **{"sweep.modes": ["on-bs32", "off"]}).sweep.modes == ["on-bs32", "off"]


def test_an_overlay_sets_its_fields_merges_mappings_and_keeps_the_rest():
    cfg = load_config(None, {"engine": {"kind": "vllm", "max_num_seqs": 64, "extra_args": {"num_gpu_blocks_override": 500}},
                             "arms": [{"name": "big-batch", "engine": {"max_num_batched_tokens": 512,
                                                                       "extra_args": {"async_scheduling": False}}},
                                      {"name": "tier", "offload": {"size_gib": 8}}]})
    e = cfg.arm_engine("big-batch")
    assert (e.max_num_batched_tokens, e.max_num_seqs, caching(e, "big-batch")) == (512, 64, True)
    assert e.extra_args == {"num_gpu_blocks_override": 500, "async_scheduling": False}
    t = cfg.arm_engine("tier")
    assert t.extra_args == {"num_gpu_blocks_override": 500, "kv_offloading_size": 8.0, "kv_offloading_backend": "native"}
    assert cfg.engine.extra_args == {"num_gpu_blocks_override": 500}  # the study's own section is untouched
    assert caching(cfg.arm_engine("off"), "off") is False


def test_the_arm_flag_is_never_written_to_the_saved_config():
    from prefixstudy.config import dump_config

    cfg = cfg_with(arms=BS32)
    text = dump_config(cfg)
    assert "prefix_caching: true" in text  # the arm's own field
    assert "prefix_caching" not in text.split("arms:")[0]  # not the engine section's
    assert parse_config(__import__("yaml").safe_load(text), "saved").arm_engine("on-bs32").block_size == 32


@pytest.mark.parametrize("arms, sets, field", [
    ([{"name": "on"}], {}, "field 'arms.0.name': 'on' is a built-in arm"),
    ([{"name": "a"}, {"name": "a"}], {}, "field 'arms.1.name': duplicate arm name 'a'"),
    ([{"name": "a b"}], {}, "field 'arms.0.name'"),
    ([{"name": "a", "colour": "red"}], {}, "field 'arms.0.colour': unknown key"),
    ([{"name": "a", "engine": {"dtype": "float16"}}], {}, "field 'arms.0.engine.dtype': engine.kind echo has no such field"),
    ([{"name": "a", "engine": {"block_size": 0}}], {}, "field 'arms.0.engine.block_size': Input should be greater than 0"),
    ([{"name": "a", "engine": {"kind": "vllm"}}], {}, "field 'arms.0.engine.kind': the arms share the study's engine.kind"),
    ([{"name": "a", "engine": {"prefix_caching": False}}], {}, "field 'arms.0.engine.prefix_caching': set it on the arm"),
    ([{"name": "a", "offload": {"size_gib": 4}}], {}, "field 'arms.0.offload': engine.kind echo has no CPU tier"),
    ([], {"sweep.modes": ["on", "sideways"]}, "--modes/--set sweep.modes: field 'sweep.modes': 'sideways' is not an arm"),
    ([], {"sweep.baseline": "a"}, "field 'sweep.baseline': 'a' is not one of the arms run"),
    ([{"name": "a"}], {"sweep.modes": ["on", "a"], "sweep.baseline": "off"},
     "field 'sweep.baseline': 'off' is not one of the arms run (sweep.modes: on, a)"),
])
def test_a_bad_arm_config_is_refused_naming_the_field(arms, sets, field):
    with pytest.raises(UserError) as e:
        cfg_with(arms=arms, **sets)
    assert field in str(e.value)
    assert "\n" not in str(e.value)


def test_offload_fields_are_checked_before_anything_starts():
    base = {"engine": {"kind": "vllm"}}
    with pytest.raises(UserError, match=r"field 'arms.0.offload.size_gib': Input should be greater than 0"):
        load_config(None, {**base, "arms": [{"name": "t", "offload": {"size_gib": 0}}]})
    with pytest.raises(UserError, match=r"field 'arms.0.offload.backend': Input should be 'native' or 'lmcache'"):
        load_config(None, {**base, "arms": [{"name": "t", "offload": {"size_gib": 1, "backend": "redis"}}]})
    with pytest.raises(UserError, match=r"field 'arms.0.offload.backend': lmcache is vLLM's LMCacheMPConnector, a "
                                        r"client of a separate LMCache server that a study neither starts nor resets"):
        load_config(None, {**base, "arms": [{"name": "t", "offload": {"size_gib": 1, "backend": "lmcache"}}]})
    with pytest.raises(UserError, match=r"field 'arms.0.offload': a CPU tier extends the prefix cache"):
        load_config(None, {**base, "arms": [{"name": "t", "prefix_caching": False, "offload": {"size_gib": 1}}]})
    with pytest.raises(UserError, match=r"field 'arms.0.offload': extra_args also sets kv_offloading_size"):
        load_config(None, {"engine": {"kind": "vllm", "extra_args": {"kv_offloading_size": 2}},
                           "arms": [{"name": "t", "offload": {"size_gib": 1}}]})
    with pytest.raises(UserError, match=r"field 'arms.0.offload': vLLM's KV offloading connector runs on CUDA"):
        load_config(None, {**base, "device": "cpu", "arms": [{"name": "t", "offload": {"size_gib": 1}}]})


def test_an_offload_arm_is_refused_on_a_machine_whose_engines_run_on_the_cpu():
    from prefixstudy.study.preflight import check_engine_config

    cfg = load_config(None, {"engine": {"kind": "vllm"}, "arms": [{"name": "t", "offload": {"size_gib": 1}}]})
    with pytest.raises(UserError, match=r"^field 'arms.0.offload': .* this machine's engines run on the CPU \(arm t\)$"):
        check_engine_config(cfg, device="cpu")


@pytest.fixture(scope="module")
def three_arms(tmp_path_factory):
    cfg = cfg_with(arms=BS32, out=str(tmp_path_factory.mktemp("res")))
    return load(run_study(cfg, progress=False))


def test_every_arm_is_its_own_engine_with_its_own_cache(three_arms):
    s = three_arms.summary
    assert sorted(s["mode"].unique()) == ["off", "on", "on-bs32"]
    assert (s["status"] == "ok").all() and len(s) == 6
    hit = s.groupby("mode")["hit_rate_measured"].agg(["min", "max"])
    assert hit.loc["on"].tolist() == [0.75, 0.75]
    assert hit.loc["on-bs32"].tolist() == [0.5, 0.5]
    assert hit.loc["off"].tolist() == [0.0, 0.0]
    assert s["hit_rate_ok"].all()  # the arm with caching is checked against its own cache estimate
    points = {(p["mode"], p["rate"]): p for p in three_arms.manifest["points"]}
    assert {m: points[(m, 40.0)]["block_size"] for m in ("on", "off", "on-bs32")} == {"on": 16, "off": 16, "on-bs32": 32}
    assert {m: points[(m, 40.0)]["prefix_caching"] for m in ("on", "off", "on-bs32")} == \
        {"on": True, "off": False, "on-bs32": True}


def test_every_arm_replays_the_same_dataset_on_the_same_schedule(three_arms):
    r = three_arms.measured
    cols = ["rate", "request_index", "scheduled_s", "prompt_tokens", "group"]
    by = {m: g[cols].sort_values(["rate", "request_index"]).reset_index(drop=True) for m, g in r.groupby("mode")}
    assert len(by["on"]) == 16
    pd.testing.assert_frame_equal(by["on"], by["off"])
    pd.testing.assert_frame_equal(by["on"], by["on-bs32"])


def test_arms_csv_pairs_every_arm_with_the_baseline(three_arms):
    a = three_arms.arms
    assert a[["rate", "arm", "baseline"]].values.tolist() == [[40.0, "on", "off"], [40.0, "on-bs32", "off"],
                                                               [80.0, "on", "off"], [80.0, "on-bs32", "off"]]
    assert (a["n_pairs"] == 8).all()
    assert a["hit_rate"].tolist() == [0.75, 0.5, 0.75, 0.5]
    assert (a["gain_mean_e2e_lo"] <= a["gain_mean_e2e"]).all() and (a["gain_mean_e2e"] <= a["gain_mean_e2e_hi"]).all()
    # ON's row is headline.csv's ON-over-OFF gain: the same pairing, the same estimate.
    h = three_arms.headline.set_index("rate")
    on = a[a["arm"] == "on"].set_index("rate")
    assert on["gain_mean_e2e"].tolist() == pytest.approx(h.loc[on.index, "gain_mean_e2e"].tolist(), rel=1e-12)


def test_the_baseline_is_the_config_s(tmp_path):
    cfg = cfg_with(arms=BS32, out=str(tmp_path), **{"sweep.baseline": "on", "sweep.rates": [40]})
    a = load(run_study(cfg, progress=False)).arms
    assert a[["arm", "baseline"]].values.tolist() == [["off", "on"], ["on-bs32", "on"]]
    ok = load(next(tmp_path.glob("*/*"))).requests
    r = ok[~ok["warmup"]]
    on = r[r["mode"] == "on"].set_index("request_index")["e2e_ms"]
    off = r[r["mode"] == "off"].set_index("request_index")["e2e_ms"]
    assert a.loc[a["arm"] == "off", "gain_mean_e2e"].item() == pytest.approx((on.mean() - off.mean()) / on.mean())


def _sentence_rate(arms: pd.DataFrame, arm: str) -> float:
    """The rate the report's sentence for ``arm`` speaks of: the highest whose gain is not a bound."""
    a = arms[arms["arm"] == arm]
    calm = a[~a["gain_is_bound"].astype(bool)]
    return float((calm if len(calm) else a)["rate"].max())


def test_the_report_shows_every_arm_and_keeps_each_arm_s_colour(three_arms):
    from prefixstudy.report import figure_kit
    from prefixstudy.report.build import build_report

    html = build_report(three_arms.path).read_text()
    assert f"arm on-bs32 against caching OFF at {_sentence_rate(three_arms.arms, 'on-bs32'):g} req/s set" in html
    assert (three_arms.path / "plots/arms.png").is_file()
    assert figure_kit.MODE_COLORS["on"] == "tab:blue" and figure_kit.MODE_COLORS["off"] == "tab:orange"
    assert figure_kit.MODE_COLORS["on-bs32"] == figure_kit.ARM_PALETTE[0]
    figure_kit.register_arms(["on", "off", "on-bs32", "later"])
    assert (figure_kit.MODE_COLORS["on-bs32"], figure_kit.MODE_COLORS["later"]) == figure_kit.ARM_PALETTE[:2]


def test_arm_engine_copies_when_there_is_no_overlay():
    cfg = cfg_with()
    e = arm_engine(cfg.engine, cfg.arm("off"))
    # The arm's caching travels with the engine config, whatever the mode is called, and is no field.
    assert e is not cfg.engine and caching(e, "any") is False and caching(e.model_copy(deep=True), "any") is False
    assert "prefix_caching" not in e.model_dump() and caching(cfg.engine, "any") is True


def test_export_writes_one_file_per_arm_told_apart_by_name(three_arms, tmp_path):
    import json

    from prefixstudy.report.bench_json import export_bench

    paths = export_bench(three_arms, tmp_path, layout="sweep")
    names = sorted(str(p.relative_to(tmp_path).parent) for p in paths)
    assert names == ["SERVE-arm=on-bs32-BENCH-request_rate=40", "SERVE-arm=on-bs32-BENCH-request_rate=80",
                     "SERVE-enable_prefix_caching=False-BENCH-request_rate=40",
                     "SERVE-enable_prefix_caching=False-BENCH-request_rate=80",
                     "SERVE-enable_prefix_caching=True-BENCH-request_rate=40",
                     "SERVE-enable_prefix_caching=True-BENCH-request_rate=80"]
    r = json.loads((tmp_path / "SERVE-arm=on-bs32-BENCH-request_rate=40/summary.json").read_text())[0]
    assert (r["prefixstudy_mode"], r["prefixstudy_baseline"], r["enable_prefix_caching"], r["completed"]) == \
        ("on-bs32", "off", True, 8)


def test_compare_shows_every_study_s_arms(three_arms, tmp_path):
    from prefixstudy.report.compare import build_compare

    html = build_compare([three_arms.path, three_arms.path], tmp_path).read_text()
    rate = _sentence_rate(three_arms.arms, "on-bs32")
    assert html.count(f"arm on-bs32 against caching OFF at {rate:g} req/s set") == 2


@pytest.mark.parametrize("key", [("on", 8.0, 0), ("off", 0.5, 2), ("on-bs32", 40.0, 1), ("on-r2", 8.0, 0),
                                 ("a-8", 1.0, 0), ("x.y_z", float("inf"), 3)])
def test_a_part_file_names_its_point_whatever_the_arm_is_called(key):
    from prefixstudy.results.store import part_key, part_name

    assert part_key(part_name(*key).removesuffix(".parquet")) == key


def test_resuming_a_run_of_arms_keeps_every_arm_s_parts(tmp_path):
    cfg = cfg_with(arms=BS32, out=str(tmp_path), **{"sweep.rates": [40]})
    run = run_study(cfg, progress=False)
    before = sorted(p.name for p in (run / "requests.parquet").iterdir())
    assert before == ["off-40.parquet", "on-40.parquet", "on-bs32-40.parquet"]
    # ON's point to run again: the resumed run drops only its parts (not the arm's, named with
    # dashes and digits), and writes them anew.
    manifest = __import__("json").loads((run / "manifest.json").read_text())
    for p in manifest["points"]:
        if p["mode"] == "on":
            p["status"] = "failed"
    (run / "manifest.json").write_text(__import__("json").dumps(manifest))
    run_study(None, resume=run, progress=False)
    assert sorted(p.name for p in (run / "requests.parquet").iterdir()) == before
    res = load(run)
    assert sorted(res.summary["mode"]) == ["off", "on", "on-bs32"] and (res.summary["status"] == "ok").all()
    assert res.manifest["status"] == "complete"


def test_arms_run_apart_merge_into_one_comparison(tmp_path):
    from prefixstudy.results.merge import merge_runs

    a = run_study(cfg_with(arms=BS32, out=str(tmp_path / "a"), **{"sweep.modes": ["on-bs32"], "sweep.rates": [40]}),
                  progress=False)
    b = run_study(cfg_with(arms=BS32, out=str(tmp_path / "b"), **{"sweep.modes": ["off", "on"], "sweep.rates": [40]}),
                  progress=False)
    merged = load(merge_runs([a, b], tmp_path / "m"))
    assert merged.config["sweep"]["modes"] == ["on", "off", "on-bs32"]
    assert merged.arms[["arm", "baseline", "n_pairs", "hit_rate"]].values.tolist() == [
        ["on", "off", 8, 0.75], ["on-bs32", "off", 8, 0.5]]


def test_ray_runs_arms_side_by_side_only_when_every_arm_s_engine_fits():
    from prefixstudy.executors.ray_plan import plan_parallel

    two_gpus, three_gpus = [{"GPU": 2, "CPU": 32}], [{"GPU": 3, "CPU": 32}]
    assert plan_parallel("auto", 3, two_gpus, True, 1, 1) == {
        "requested": "auto", "used": False, "turns": False,
        "reason": "auto: the cluster fits only 2 engines of 1 GPU(s) (2 GPUs); modes run one after the other"}
    assert plan_parallel("auto", 3, three_gpus, True, 1, 1)["reason"] == \
        "auto: the cluster fits 3 engines of 1 GPU(s) side by side"
    assert plan_parallel("on", 3, [{"CPU": 3}], False, 1, 1)["reason"] == "parallel on: all 3 engines run side by side"
    with pytest.raises(UserError,
                       match=r"^--parallel on: the Ray cluster has room for 2 engines, not 3 \(1 GPUs on one node each\)$"):
        plan_parallel("on", 3, two_gpus, True, 1, 1)
    assert plan_parallel("auto", 3, [{"CPU": 8}], False, 1, 1)["reason"] == (
        "auto: 8 CPUs; 3 CPU engines side by side need 3 x (1 + 2) = 9 CPUs (engine cores + load generator and "
        "engine loop); modes run one after the other")


def test_the_console_says_when_auto_runs_the_arms_one_after_the_other():
    from prefixstudy.executors.ray_plan import one_after_the_other, plan_parallel

    one_gpu = [{"GPU": 1, "CPU": 16}]
    said = "ray: the arms run one after the other (neither side by side nor in turns); the manifest's parallel says why"
    assert one_after_the_other(plan_parallel("auto", 2, one_gpu, True, 1, 1)) == said
    assert one_after_the_other(plan_parallel("auto", 2, [{"GPU": 2, "CPU": 16}], True, 1, 1)) == ""  # side by side
    assert one_after_the_other(plan_parallel("off", 2, one_gpu, True, 1, 1)) == ""  # asked for
    assert one_after_the_other(plan_parallel("auto", 1, one_gpu, True, 1, 1)) == ""  # one arm (or what a resume has left)
    assert one_after_the_other(plan_parallel("auto", 2, [{"GPU": 2, "CPU": 16}], True, 1, 1, replicas=2)) == said


def test_an_arm_s_engine_arguments_are_checked_by_vllm_naming_the_arm():
    from prefixstudy.study.preflight import check_engine_config

    cfg = load_config(None, {"engine": {"kind": "vllm"}, "executor": "local",
                             "arms": [{"name": "odd", "engine": {"extra_args": {"no_such_vllm_arg": 1}}}]})
    with pytest.raises(UserError) as e:
        check_engine_config(cfg, device="cpu")
    assert str(e.value) == "field 'engine.extra_args.no_such_vllm_arg': unknown vLLM engine argument (arm odd)"


@pytest.fixture(scope="module")
def cold_warm(tmp_path_factory):
    """Two arms named neither on nor off: ``cold`` without prefix caching, the baseline, and
    ``warm`` with it (16-token blocks: 48 of a 64-token prompt served)."""
    cfg = cfg_with(arms=[{"name": "cold", "prefix_caching": False}, {"name": "warm"}],
                   out=str(tmp_path_factory.mktemp("res")),
                   **{"sweep.modes": ["cold", "warm"], "sweep.baseline": "cold", "sweep.rates": [40]})
    return load(run_study(cfg, progress=False))


def test_the_headline_compares_the_configured_arms_whatever_their_names(cold_warm):
    s = cold_warm.summary.set_index("mode")
    assert s.loc[["cold", "warm"], "hit_rate_measured"].tolist() == [0.0, 0.75]
    assert s["hit_rate_ok"].all()  # cold is checked as an arm without caching: it must never hit
    h = cold_warm.headline
    assert len(h) == 1 and not [c for c in h.columns if c.startswith(("on_", "off_"))]
    r = cold_warm.measured
    mean = {m: r.loc[r["mode"] == m, "e2e_ms"].mean() for m in ("cold", "warm")}
    row = h.iloc[0]
    assert (row["n_pairs"], row["warm_hit_rate"], row["warm_hit_rate_expected"]) == (8, 0.75, 0.75)
    assert (row["warm_mean_e2e_ms"], row["cold_mean_e2e_ms"]) == pytest.approx((mean["warm"], mean["cold"]), rel=1e-12)
    assert row["gain_mean_e2e"] == pytest.approx((mean["cold"] - mean["warm"]) / mean["cold"], rel=1e-12)
    a = cold_warm.arms  # arms.csv: the same pairing, the same estimate
    assert a[["rate", "arm", "baseline"]].values.tolist() == [[40.0, "warm", "cold"]]
    assert a["gain_mean_e2e"].item() == pytest.approx(row["gain_mean_e2e"], rel=1e-12)


def test_the_report_and_breakdown_compare_the_configured_arms(cold_warm):
    from prefixstudy.metrics.breakdown import breakdown
    from prefixstudy.report.build import build_report
    from prefixstudy.report.data import analyze

    d = analyze(cold_warm, n_boot=50)
    assert d.arms == ("warm", "cold") and set(d.knees) == {"warm", "cold"}
    assert d.gains["n_on"].tolist() == [8, 8] and d.paired["n_pairs"].tolist() == [8]
    build_report(cold_warm.path, n_boot=50, formats=("png",))
    md = (cold_warm.path / "report.md").read_text()
    h = cold_warm.headline.iloc[0]
    saved = h["cold_mean_e2e_ms"] - h["warm_mean_e2e_ms"]
    assert (f"At {h['arrival_rate']:.2f} req/s warm saves {saved:.0f} ms of cold's {h['cold_mean_e2e_ms']:.0f} ms"
            in md)
    assert "| warm mean E2E (ms) | cold mean E2E (ms) |" in md and "hit rate warm (expected)" in md
    assert "| 0.750 (0.750) |" in md and "caching ON" not in md
    b = breakdown(cold_warm.requests, "group", "cold")
    assert b.loc[b["mode"] == "warm", "cached_share"].tolist() == [0.75, 0.75]
    assert b.loc[b["mode"] == "warm", "e2e_gain"].notna().all() and b.loc[b["mode"] == "cold", "e2e_gain"].isna().all()
