"""``simulate`` end to end on the tiny Llama: a calibration whose steps cost exactly
1 ms + 0.01 ms per prompt token + 0.1 ms per decode token, requests that never overlap, so every
latency is a sum worked out by hand; the results layout is the real run's."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pandas as pd
import pytest
import yaml

from prefixstudy.config import load_config
from prefixstudy.errors import UserError
from prefixstudy.results import load
from prefixstudy.study.simulate import simulate

from pathlib import Path

TINY = str(Path(__file__).resolve().parents[3] / "prefixstudy/configs/models/tiny-llama")

OVERRIDES = {
    "model": TINY, "study": "simtest",
    "dataset.prefix_len": 48, "dataset.suffix_len": 16, "dataset.output_len": 4,
    "sweep.rates": [1, 2], "sweep.num_requests": 3, "sweep.warmup_requests": 1,
    "arrivals.process": "constant", "engine.block_size": 16,
    "engine.extra_args": {"num_gpu_blocks_override": 64},
}


@pytest.fixture
def calibration(tmp_path):
    """A CPU study's folder with engine-timed steps costing the unit model exactly."""
    d = tmp_path / "calib"
    (d / "iterations.parquet").mkdir(parents=True)
    steps = pd.DataFrame({"prefill_tokens": [64, 0, 16, 0, 200], "decode_tokens": [0, 1, 1, 3, 2],
                          "context_tokens": [64, 65, 81, 200, 500]})
    steps["step_ms"] = 1 + 0.01 * steps.prefill_tokens + 0.1 * steps.decode_tokens
    steps["context_tokens"] = 0  # constant: left out of the fit
    steps["mode"], steps["rate"], steps["timing"] = "on", 1.0, "engine"
    steps.to_parquet(d / "iterations.parquet" / "on-1.parquet")
    (d / "manifest.json").write_text(json.dumps({"device": "cpu", "points": [{"block_size": 16}]}))
    (d / "config.yaml").write_text(yaml.safe_dump({"model": TINY}))
    return d


def test_simulated_study_matches_the_hand_schedule(calibration, tmp_path, tiny_vllm_config):
    cfg = load_config(None, OVERRIDES)
    res = load(simulate(cfg, calibration, out=tmp_path / "out"))
    s = res.summary.set_index(["mode", "rate"])
    assert list(s.n_ok) == [3, 3, 3, 3] and set(s.status) == {"ok"}
    # OFF: 64-token prefill 1.64 ms, then 3 decodes of 1.1 ms; ON: 48 cached, 16 computed: 1.16 ms
    assert s.loc[("off", 1.0), "mean_e2e_ms"] == pytest.approx(1.64 + 3.3)
    assert s.loc[("on", 1.0), "mean_e2e_ms"] == pytest.approx(1.16 + 3.3)
    assert s.loc[("on", 2.0), "mean_ttft_ms"] == pytest.approx(1.16)
    assert s.loc[("on", 1.0), "hit_rate_measured"] == pytest.approx(48 / 64) and bool(s.loc[("on", 1.0), "hit_rate_ok"])
    m = res.requests[~res.requests.warmup]
    assert set(m.num_cached_tokens[m["mode"] == "on"]) == {48}
    assert m.dispatch_lag_ms.abs().max() < 1e-9  # sent exactly on schedule (up to float rounding)
    it = res.iterations[(res.iterations["mode"] == "off") & (res.iterations.rate == 1.0)]
    assert list(it.prompt_tokens) == [64, 0, 0, 0] * 3 and list(it.step_ms) == pytest.approx([1.64, 1.1, 1.1, 1.1] * 3)
    assert res.manifest["sim"]["num_gpu_blocks"] == 64 and res.manifest["engine"] == "sim"
    # the engine the calibration ran, here one step at a time
    assert [p["async_scheduling"] for p in res.manifest["points"]] == [False] * 4


def test_simulate_takes_its_folders_as_str(calibration, tmp_path, tiny_vllm_config):
    # From a script a folder is often a str: the calibration, the results root and the run folder.
    run = simulate(load_config(None, OVERRIDES), str(calibration), out=str(tmp_path / "out"),
                   run_dir=str(tmp_path / "run"))
    assert run == tmp_path / "run" and load(run).summary["mean_e2e_ms"].tolist() == pytest.approx([4.46, 4.46, 4.94, 4.94])


def test_a_simulated_study_ends_as_a_measured_one(calibration, tmp_path, tiny_vllm_config):
    """Its points go through the study's point policy and its end writes what a measured run's
    does: status from the points, the step fit, and headline.csv with the hand schedule's gain."""
    run = simulate(load_config(None, OVERRIDES), calibration, out=tmp_path / "out")
    res = load(run)
    assert res.manifest["status"] == "complete"
    assert [p["hit_rate_ok"] for p in res.manifest["points"]] == [True] * 4
    assert res.manifest["step_timing"] == ["sim"]  # recorded by the end of a run, over every point's steps
    h = pd.read_csv(run / "headline.csv")
    assert list(h.rate) == [1.0, 2.0] and list(h.n_pairs) == [3, 3]
    assert list(h.on_mean_e2e_ms) == pytest.approx([4.46, 4.46]) and list(h.off_mean_e2e_ms) == pytest.approx([4.94] * 2)
    assert list(h.gain_mean_e2e) == pytest.approx([(4.94 - 4.46) / 4.94] * 2)
    assert list(h.on_hit_rate) == pytest.approx([0.75, 0.75])


def test_points_run_on_a_frozen_heap_and_the_caller_gets_it_back_unfrozen(calibration, tmp_path, tiny_vllm_config,
                                                                          monkeypatch):
    """The collector skips what was allocated before a point (sim.sessions.frozen_heap); called from
    Python, the simulation unfreezes on the way out, so the sessions it dropped (their free-block
    queues are cycles) are collected, not kept for the life of the caller's process."""
    import gc

    from vllm.v1.core.kv_cache_utils import KVCacheBlock

    from prefixstudy.sim.sessions import SimSession

    def blocks() -> int:
        gc.collect()
        return sum(type(o) is KVCacheBlock for o in gc.get_objects())

    scanned, run_point = [], SimSession.run_point

    def counted(self, rate, repeat=0):  # the block objects the collector would walk (not the frozen ones)
        scanned.append(sum(type(o) is KVCacheBlock for o in gc.get_objects()))
        return run_point(self, rate, repeat)

    monkeypatch.setattr(SimSession, "run_point", counted)
    before = blocks()
    simulate(load_config(None, OVERRIDES), calibration, out=tmp_path / "out")
    assert scanned == [0] * 4  # both sessions' 64 blocks frozen at every point
    assert gc.get_freeze_count() == 0
    assert blocks() == before


@pytest.mark.slow  # a fresh interpreter: vLLM's import
def test_called_from_python_it_shows_none_of_vllm_s_notes(calibration, tmp_path):
    """A library call in a fresh interpreter, as the accuracy scripts make it: vLLM configures its
    logger on import and again when it resolves a config, and neither its platform warnings, its
    config notes nor a line per cache reset reach the console."""
    code = ("import sys; from pathlib import Path; from prefixstudy.config import load_config; "
            "from prefixstudy.study.simulate import simulate; "
            f"simulate(load_config(None, {OVERRIDES!r}), Path(sys.argv[1]), out=Path(sys.argv[2]))")
    env = {k: v for k, v in os.environ.items() if k != "VLLM_LOGGING_LEVEL"}
    r = subprocess.run([sys.executable, "-c", code, str(calibration), str(tmp_path / "out")],
                       capture_output=True, text=True, timeout=300, env=env)
    assert (r.returncode, r.stdout, r.stderr) == (0, "", "")
    assert len(list((tmp_path / "out").glob("*/*/summary.csv"))) == 1


def test_a_cpu_calibration_cannot_price_a_gpu(calibration, tmp_path):
    cfg = load_config(None, OVERRIDES)
    with pytest.raises(UserError, match="--gpu H200-SXM: the calibration study ran on the CPU"):
        simulate(cfg, calibration, gpu_name="H200-SXM", out=tmp_path / "out")


def test_a_folder_without_a_manifest_is_refused(tmp_path):
    with pytest.raises(UserError, match="no readable manifest.json"):
        simulate(load_config(None, OVERRIDES), tmp_path, out=tmp_path / "out")


@pytest.mark.slow
def test_points_in_worker_processes_match_the_hand_schedule(calibration, tmp_path):
    """--jobs 2: each point in a spawned worker with a fresh scheduler; the same numbers."""
    cfg = load_config(None, OVERRIDES)
    s = load(simulate(cfg, calibration, out=tmp_path / "out", jobs=2)).summary.set_index(["mode", "rate"])
    assert list(s.index) == [("on", 1.0), ("on", 2.0), ("off", 1.0), ("off", 2.0)]
    assert list(s.mean_e2e_ms) == pytest.approx([4.46, 4.46, 4.94, 4.94])
    assert list(s.n_ok) == [3, 3, 3, 3]


def test_the_point_deadline_leaves_late_arrivals_unsent(calibration, tmp_path):
    """Constant arrivals at 1 req/s, a 1.5 s point: requests 0 and 1 are sent, request 2 (due at
    2 s) is not, and is a row with the runner's error, never dropped."""
    cfg = load_config(None, {**OVERRIDES, "sweep.rates": [1], "sweep.max_point_duration_s": 1.5})
    req = load(simulate(cfg, calibration, out=tmp_path / "out")).measured
    on = req[req["mode"] == "on"].sort_values("request_index")
    assert list(on.error) == ["", "", "unfinished: not sent before max_point_duration_s"]
    assert list(on.output_tokens) == [4, 4, 0]


def test_engine_kind_sim_is_prefixstudy_run_in_virtual_time(calibration, tmp_path):
    """A config that says engine.kind sim: `prefixstudy run` simulates it, with the numbers the
    hand schedule gives (as `simulate` with flags does), and writes its config beside the results."""
    from click.testing import CliRunner

    from prefixstudy.cli import main

    path = tmp_path / "sim.yaml"
    data = {"model": TINY, "study": "simtest", "out": str(tmp_path / "out"), "arrivals": {"process": "constant"},
            "engine": {"kind": "sim", "calibration": str(calibration), "block_size": 16,
                       "extra_args": {"num_gpu_blocks_override": 64}},
            "dataset": {"prefix_len": 48, "suffix_len": 16, "output_len": 4},
            "sweep": {"rates": [1, 2], "num_requests": 3, "warmup_requests": 1}}
    path.write_text(yaml.safe_dump(data))
    dry = CliRunner().invoke(main, ["run", str(path), "--dry-run"])
    assert dry.exit_code == 0 and dry.output.endswith("executor sim (virtual time); nothing run (--dry-run)\n")
    r = CliRunner().invoke(main, ["run", str(path), "--no-report"])
    assert r.exit_code == 0, r.output
    (line,) = [ln for ln in r.output.splitlines() if ln.startswith("results: ")]
    res = load(line.removeprefix("results: "))
    s = res.summary.set_index(["mode", "rate"])
    assert list(s.mean_e2e_ms) == pytest.approx([4.46, 4.46, 4.94, 4.94])
    assert res.manifest["engine"] == "sim" and res.manifest["sim"]["calibration"] == str(calibration)
    assert res.config["engine"]["kind"] == "sim"


def test_engine_kind_sim_names_a_missing_calibration_in_one_line(tmp_path):
    from click.testing import CliRunner

    from prefixstudy.cli import main

    path = tmp_path / "sim.yaml"
    path.write_text(yaml.safe_dump({"model": TINY, "out": str(tmp_path / "out"),
                                    "engine": {"kind": "sim", "calibration": str(tmp_path / "nowhere")}}))
    r = CliRunner().invoke(main, ["run", str(path)])
    assert r.exit_code == 2
    assert r.output == f"error: field 'engine.calibration': {tmp_path / 'nowhere'} not found (a study's results " \
                       "folder or a cost_model.json)\n"
    assert not (tmp_path / "out").exists()


REFUSED = {
    "echo": "it ran engine.kind echo, whose requests never share an engine step, so it holds no step cost for "
            "vLLM's scheduler to replay; calibrate on a run of vllm, http, vllm-server, sglang-server",
    "sim": "it is a simulated run; give its step cost instead, {run}/cost_model.json",
}


@pytest.mark.parametrize("kind", sorted(REFUSED))
def test_a_calibration_without_an_engines_shared_steps_is_refused_in_one_line(tmp_path, kind):
    """An echo run (each request answered alone) or a simulated run's folder as `--calibration`:
    exit 2, one line, no results folder; the Python API refuses it the same way, under the flag's
    name."""
    from click.testing import CliRunner

    from prefixstudy.cli import main

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(yaml.safe_dump({"model": TINY, "engine": {"kind": kind}}))
    study = tmp_path / "study.yaml"
    study.write_text(yaml.safe_dump({"model": TINY, "out": str(tmp_path / "out")}))
    why = REFUSED[kind].format(run=run)
    r = CliRunner().invoke(main, ["simulate", str(study), "--calibration", str(run), "--no-report"])
    assert (r.exit_code, r.output) == (2, f"error: field 'engine.calibration': {run}: {why}\n")
    with pytest.raises(UserError) as refused:
        simulate(load_config(None, OVERRIDES), run, out=tmp_path / "out")
    assert str(refused.value) == f"--calibration: {run}: {why}"
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("kind", ["vllm", "sim"])
def test_a_fleet_is_refused_in_one_line(calibration, tmp_path, kind):
    """`prefixstudy simulate` of a config with replicas: 2 (the simulator has no router), whether
    the config names the simulator or a real backend: exit 2, one line, no results folder."""
    from click.testing import CliRunner

    from prefixstudy.cli import main

    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump({"model": TINY, "out": str(tmp_path / "out"), "replicas": 2,
                                    "engine": {"kind": kind, **({"calibration": str(calibration)} if kind == "sim"
                                                                else {})}}))
    r = CliRunner().invoke(main, ["simulate", str(path), "--calibration", str(calibration), "--no-report"])
    assert (r.exit_code, r.output) == (2, "error: field 'replicas': the simulator runs one engine per arm (no router "
                                          "yet); simulate with replicas: 1, or measure a fleet with an in-process "
                                          "backend (vllm, echo)\n")
    assert not (tmp_path / "out").exists()


def test_engine_kind_sim_names_an_unknown_gpu_in_one_line(calibration, tmp_path):
    from click.testing import CliRunner

    from prefixstudy.cli import main

    path = tmp_path / "sim.yaml"
    path.write_text(yaml.safe_dump({"model": TINY, "out": str(tmp_path / "out"),
                                    "engine": {"kind": "sim", "calibration": str(calibration), "gpu": "Nope-9000"}}))
    r = CliRunner().invoke(main, ["run", str(path)])
    assert (r.exit_code, r.output) == (
        2, "error: field 'engine.gpu': unknown GPU 'Nope-9000' (see prefixstudy/costmodel/gpus.py)\n")
    assert not (tmp_path / "out").exists()



def test_a_simulated_session_sends_its_next_turn_after_the_parent_with_the_history(calibration, tmp_path,
                                                                                  tiny_vllm_config):
    """One session of two turns: turn 0 is 64 tokens (48 + 16, nothing primed: one session shares
    nothing with another); turn 1 is sent 0.5 s after turn 0's last token with its 64 + 4 generated
    + 16 new tokens.  Turn 0 computed 67 tokens, so ON serves 4 whole blocks (64) of turn 1's 84."""
    cfg = load_config(None, {**OVERRIDES, "sweep.rates": [1], "sweep.num_requests": 2, "sweep.warmup_requests": 0,
                             "dataset.kind": "sessions",
                             "dataset.sessions": {"turns": 2, "user_len": 16, "think_time_s": 0.5}})
    req = load(simulate(cfg, calibration, out=tmp_path / "out")).requests
    for mode, cached in (("on", 64), ("off", 0)):
        m = req[req["mode"] == mode].sort_values("turn")
        assert m.turn.tolist() == [0, 1] and m.prompt_tokens.tolist() == [64, 84]
        assert m.num_cached_tokens.tolist() == [0, cached] and m.parent_index.tolist() == [-1, 0]
        t0_done = m.scheduled_s.iloc[0] + m.e2e_ms.iloc[0] / 1e3
        assert m.scheduled_s.iloc[1] == pytest.approx(t0_done + 0.5)
        assert m.ttft_ms.iloc[1] == pytest.approx(1 + 0.01 * (84 - cached))  # one prefill step


H200_TP1 = Path(__file__).resolve().parents[3] / "experiments/results/h200-tp1-sync"


def test_another_model_on_the_committed_h200_calibration_is_priced_by_its_roofline(tmp_path):
    """Mistral-7B's h200-tp1 fit carried to the same model with twice the layers: the manifest and
    cost_model.json name both models and each term's scale (hand-computed in test_cost: weights x
    105/53, prefill tokens and per-prefill cost x 2, decode by its FLOPs and mean KV read), and the
    first step, one 80-token prefill, costs what the scaled fit says.  A cost_model.json the run
    wrote prices the same steps again when given as the calibration."""
    deep = tmp_path / "mistral-64-layers"
    deep.mkdir()
    mistral = json.loads((Path(TINY).parent / "mistral-7b-v0.3/config.json").read_text())
    (deep / "config.json").write_text(json.dumps({**mistral, "num_hidden_layers": 64}))
    over = {"model": str(deep), "study": "xmodel", "dataset.prefix_len": 64, "dataset.suffix_len": 16,
            "dataset.output_len": 4, "sweep.rates": [1], "sweep.num_requests": 2, "sweep.warmup_requests": 0,
            "sweep.modes": ["off"], "sweep.repeats": 1, "arrivals.process": "constant", "engine.block_size": 16,
            "engine.gpu_memory_utilization": 0.9}
    cfg = load_config(None, over)
    res = load(simulate(cfg, H200_TP1, out=tmp_path / "out"))
    sim = res.manifest["sim"]
    assert sim["source"]["model"] == "/work/main/prefixstudy/configs/models/mistral-7b-v0.3"
    assert (sim["source"]["layers"], sim["target"]["layers"], sim["target"]["model"]) == (32, 64, str(deep))
    assert (sim["source"]["gpu"], sim["target"]["gpu"], sim["target"]["tp"]) == ("H200-SXM", "H200-SXM", 1)
    flops_ms, kv_ms = 2 * 7113539584 / 989e12 * 1e3, 82 * 131072 / 4.8e12 * 1e3  # context 80 + 4 / 2
    assert sim["scale"] == pytest.approx({"c0": 105 / 53, "prefill_tokens": 2.0, "num_prefill_reqs": 2.0,
                                          "decode_tokens": (flops_ms * 105 / 53 + 2 * kv_ms) / (flops_ms + kv_ms)})
    assert sim["extrapolations"] == []
    saved = json.loads((res.path / "cost_model.json").read_text())
    assert saved["transfer"]["source"] == sim["source"] and saved["transfer"]["scale"] == sim["scale"]
    fit = json.loads((H200_TP1 / "manifest.json").read_text())["step_fit"]
    first = res.iterations.sort_values("t_s").iloc[0]
    assert (first.prompt_tokens, first.num_prefill_reqs) == (80, 1)
    c0 = fit["a_ms"] - 2.963975 + 2.963975 * 105 / 53
    assert first.step_ms == pytest.approx(c0 + 2 * fit["b_ms_per_prefill_token"] * 80
                                          + 2 * fit["e_ms_per_prefill_req"], rel=1e-6)
    again = load(simulate(cfg, res.path / "cost_model.json", out=tmp_path / "again"))
    assert again.manifest["sim"]["scale"] == pytest.approx({"c0": 1.0, "prefill_tokens": 1.0, "num_prefill_reqs": 1.0,
                                                            "decode_tokens": 1.0})
    assert list(again.iterations.step_ms) == pytest.approx(list(res.iterations.step_ms), rel=1e-12)


def test_another_model_on_a_cpu_calibration_is_refused(calibration, tmp_path):
    cfg = load_config(None, {**OVERRIDES, "model": str(Path(TINY).parent / "mistral-7b-v0.3")})
    with pytest.raises(UserError, match=r"^field 'model': .*mistral-7b-v0.3 is not the model the calibration ran "
                                        r"\(.*tiny-llama\), and the calibration ran on the CPU: no roofline"):
        simulate(cfg, calibration, out=tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_the_same_model_on_a_cpu_calibration_records_unit_scales(calibration, tmp_path):
    sim = load(simulate(load_config(None, OVERRIDES), calibration, out=tmp_path / "out")).manifest["sim"]
    assert {k: sim["source"][k] for k in ("model", "gpu", "tp", "layers", "hidden")} == \
        {"model": TINY, "gpu": "cpu", "tp": 1, "layers": 2, "hidden": 256}
    assert sim["target"] == sim["source"]
    assert sim["scale"] == {"c0": 1.0, "prefill_tokens": 1.0, "decode_tokens": 1.0} and sim["extrapolations"] == []


def test_an_extrapolating_transfer_warns_in_one_line_and_records_it(tmp_path, caplog):
    """Three times Mistral's layers (2.96x its weights) and 4 KV heads instead of 8: the target is
    priced, with one warning line per extrapolation, the same sentences in the transfer record."""
    import logging

    from prefixstudy.study.simulate import make_target
    from prefixstudy.workloads import load_rows

    big = tmp_path / "mistral-96-layers"
    big.mkdir()
    mistral = json.loads((Path(TINY).parent / "mistral-7b-v0.3/config.json").read_text())
    (big / "config.json").write_text(json.dumps({**mistral, "num_hidden_layers": 96, "num_key_value_heads": 4}))
    cfg = load_config(None, {"model": str(big), "dataset.prefix_len": 64, "dataset.suffix_len": 16,
                             "dataset.output_len": 4, "engine.block_size": 16, "engine.gpu_memory_utilization": 0.9})
    with caplog.at_level(logging.WARNING, logger="prefixstudy.study.simulate"):
        target = make_target(cfg, H200_TP1, None, None, load_rows(cfg))
    notes = target.cost.transfer["extrapolations"]
    assert [r.getMessage() for r in caplog.records] == [
        f"warning: simulating {big} on a calibration of /work/main/prefixstudy/configs/models/mistral-7b-v0.3 "
        f"extrapolates: {n}" for n in notes]
    assert [n.split(":")[0] for n in notes] == [
        "the target has 2.91x the calibration model's weights",
        "attention layout differs (query heads per KV head 8 vs 4, head_dim 128 vs 128)"]
    # Projections per layer: 104 x 2^21 weights with 8 KV heads, 102 x 2^21 with 4 (k and v 512 wide).
    assert target.cost.transfer["scale"]["prefill_tokens"] == pytest.approx(96 * 102 / (32 * 104), rel=1e-12)


@pytest.mark.slow
def test_a_simulated_runs_report_says_what_its_error_is_made_of_before_any_number(calibration, tmp_path,
                                                                                    tiny_vllm_config):
    from prefixstudy.report.build import build_report

    run = simulate(load_config(None, OVERRIDES), calibration, out=tmp_path / "out")
    build_report(run, formats=("png",))
    text = (run / "report.md").read_text()
    first = text.index("Simulated, not measured: the intervals")
    assert first < text.index("| rate (req/s): actual (set)")  # before the headline table
    assert f"Calibration, a fit on {calibration}'s step records of one engine step at a time: held out" in text
    assert "Transfer: none. The simulated GPU, TP degree and model are the calibration's own" in text


def test_a_simulated_run_cut_short_resumes_to_what_an_uninterrupted_one_gives(calibration, tmp_path, tiny_vllm_config):
    """`prefixstudy run --resume` of a simulated run: its missing points run in virtual time with the
    engine and step costs the run recorded (never on a real engine, whatever its config names), the
    kept points stay as they were, and virtual time makes the whole summary the uninterrupted run's."""
    from prefixstudy.study.orchestrate import run_study

    whole = load(simulate(load_config(None, OVERRIDES), calibration, out=tmp_path / "whole"))
    run = simulate(load_config(None, OVERRIDES), calibration, out=tmp_path / "cut")
    m = json.loads((run / "manifest.json").read_text())
    kept = m["points"][:2]  # as if stopped after ON's two points
    (run / "manifest.json").write_text(json.dumps({**m, "points": kept, "status": "interrupted"}))
    run_study(None, resume=run, progress=False)
    res = load(run)
    assert res.manifest["status"] == "complete" and len(res.manifest["resumed_at"]) == 1
    assert [(p["mode"], p["rate"]) for p in res.manifest["points"]] == [(p["mode"], p["rate"]) for p in m["points"]]
    assert [p["started_at"] for p in res.manifest["points"][:2]] == [p["started_at"] for p in kept]
    key = ["mode", "rate", "repeat"]
    pd.testing.assert_frame_equal(res.summary.sort_values(key).reset_index(drop=True),
                                  whole.summary.sort_values(key).reset_index(drop=True))
    # Without the step-cost model it saved, the run cannot be priced as it was: one line, nothing run.
    (run / "cost_model.json").unlink()
    m = json.loads((run / "manifest.json").read_text())
    (run / "manifest.json").write_text(json.dumps({**m, "points": kept, "status": "interrupted"}))
    with pytest.raises(UserError, match=r"cost_model\.json: not a step-cost model JSON"):
        run_study(None, resume=run, progress=False)
