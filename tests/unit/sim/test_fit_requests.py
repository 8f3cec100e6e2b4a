"""The step cost fitted to request timestamps alone (``costmodel.timestamp_fit``, ``sim.fit_requests``): a run the simulator made
with known coefficients is recovered from its requests; a run with too few loads is refused in one
line; the coordinate search finds a known minimum."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from prefixstudy.config import load_config
from prefixstudy.errors import UserError
from prefixstudy.results import load
from prefixstudy.results.store import read_table
from prefixstudy.costmodel import timestamp_fit as tf
from prefixstudy.sim import fit_requests as fr
from prefixstudy.costmodel.step_cost import CostModel
from prefixstudy.study.simulate import simulate
from tests import forkcli

REPO = Path(__file__).resolve().parents[3]
TINY = str(REPO / "prefixstudy/configs/models/tiny-llama")
SERVER = REPO / "experiments/results/h200-vllm-server"
TRUTH = {"c0": 2.0, "prefill_tokens": 0.01, "num_prefill_reqs": 0.5, "decode_tokens": 0.2}
OVERRIDES = {"model": TINY, "study": "synthetic", "dataset.prefix_len": 48, "dataset.suffix_len": 16,
             "dataset.output_len": 16, "sweep.rates": [20, 60, 120], "sweep.num_requests": 40,
             "sweep.min_duration_s": 0.0, "sweep.warmup_requests": 1, "engine.block_size": 16,
             "engine.extra_args": {"num_gpu_blocks_override": 256}}


@pytest.fixture(scope="module")
def synthetic_run(tmp_path_factory):
    """A CPU run the simulator made with the ``TRUTH`` step cost, its step records removed: a
    calibration run as an HTTP server's looks (request timestamps only)."""
    tmp = tmp_path_factory.mktemp("synthetic")
    truth = fr.cost_model(TRUTH)
    truth.transfer = {"target": {"model": TINY, "gpu": "cpu", "tp": 1}}
    truth.save(tmp / "truth.json")
    run = simulate(load_config(None, OVERRIDES), tmp / "truth.json", out=tmp / "out")
    shutil.rmtree(run / "iterations.parquet")
    manifest = json.loads((run / "manifest.json").read_text())
    (run / "manifest.json").write_text(json.dumps({**manifest, "device": "cpu"}))
    return run


def test_a_run_without_step_records_is_fitted_to_its_timestamps_and_the_coefficients_come_back(synthetic_run,
                                                                                               tmp_path):
    assert not fr.has_step_records(synthetic_run)
    run = simulate(load_config(None, {**OVERRIDES, "study": "again"}), synthetic_run, out=tmp_path / "out")
    cost = json.loads((run / "cost_model.json").read_text())
    assert cost["timing"] == "request-timestamps" and cost["source"] == str(synthetic_run)
    got = {"c0": cost["c0_ms"], **cost["coef_ms"]}
    # The schedule makes the error a staircase in the coefficients, so the search stops near the
    # truth, not on it: within 3 % on c0 and the per-token terms, 20 % on the per-prefill term
    # (a prefill is 1 step in 16 here: it moves a request's latency least).
    for term, rel in (("c0", 0.03), ("prefill_tokens", 0.06), ("decode_tokens", 0.04), ("num_prefill_reqs", 0.2)):
        assert got[term] == pytest.approx(TRUTH[term], rel=rel), term
    e = cost["fit_error"]
    # The search stops on its own, its step below min_step, well before the backstop.
    assert e["points"] == 6 and e["requests"] == 240 and e["simulations"] == 48 < fr.MAX_EVALS
    assert e["e2e_mean_abs_err"] < 0.01 and e["e2e_max_abs_err"] < 0.025
    assert e["client_offset_ms"] == 0.0  # the simulator's own run: no server between engine and client
    assert load(run).manifest["sim"]["fit_error"] == e
    assert load(run).manifest["sim"]["calibration_timing"] == "request-timestamps"
    assert fr.fit_error_line(run) == (
        f"step cost fitted to {synthetic_run}'s request timestamps (6 points, 48 simulations): mean "
        f"|error| on them E2E {e['e2e_mean_abs_err']:.1%} (worst {e['e2e_max_abs_err']:.1%}), TPOT "
        f"{e['tpot_mean_abs_err']:.1%}, TTFT {e['ttft_mean_abs_err']:.1%} with a client offset of 0.0 ms")


def test_the_true_coefficients_reproduce_the_run_exactly(synthetic_run):
    """The fit's own simulation of its subsample is the run's: at the truth every point's error is 0
    (a fit simulating more requests than the run sent, or other arrivals, would not be)."""
    req, summary = fr.load_run(synthetic_run)
    points = fr.fit_points(req, summary)
    cfg = load_config(synthetic_run / "config.yaml")
    from prefixstudy.sim.sessions import SimTarget
    from prefixstudy.workloads import load_rows

    sim = fr.PointSimulator(cfg, load_rows(cfg), SimTarget("cpu", 1, 256, 16, None), points, fr.MAX_REQUESTS)
    err = tf.point_errors(sim.run(fr.cost_model(TRUTH)), points)
    assert list(points["n"]) == [40] * 6
    assert np.abs(err[["ttft_ms_err", "tpot_ms_err", "e2e_ms_err"]].to_numpy()).max() < 1e-12
    assert tf.loss(tf.point_errors(sim.run(fr.cost_model({**TRUTH, "c0": 2.2})), points)) > 0.05


def test_the_fit_counts_its_simulations_on_a_line_it_clears(synthetic_run, capsys):
    """A fit runs for tens of seconds on a real study: on a terminal a line counts its simulations
    (``bar=None`` shows one only there), with no total (the search stops on its own), and clears
    itself for the result lines."""
    req, summary = fr.load_run(synthetic_run)
    cfg = load_config(synthetic_run / "config.yaml")
    from prefixstudy.sim.sessions import SimTarget
    from prefixstudy.workloads import load_rows

    rows, target = load_rows(cfg), SimTarget("cpu", 1, 256, 16, None)
    fr.fit_timestamps(cfg, rows, target, req, summary, "x", max_evals=3, bar=True)
    err = capsys.readouterr().err
    states = [s for s in err.split("\r") if s.strip()]
    # one state per simulation, no percentage or ETA; then the line cleared
    assert [s.split(" [")[0] for s in states] == [f"fitting the step cost: {n} simulations" for n in range(4)]
    assert not any("%" in s for s in states) and err.endswith("\r")
    fr.fit_timestamps(cfg, rows, target, req, summary, "x", max_evals=3, bar=None)
    assert capsys.readouterr().err == ""  # pytest's stderr is no terminal


def test_the_first_guess_from_timestamps_is_near_the_truth(synthetic_run):
    req, summary = fr.load_run(synthetic_run)
    guess = tf.first_guess(req, fr.fit_points(req, summary))
    for term, rel in (("c0", 0.02), ("prefill_tokens", 0.03), ("decode_tokens", 0.05), ("num_prefill_reqs", 0.2)):
        assert guess[term] == pytest.approx(TRUTH[term], rel=rel), term


def one_rate_run(tmp: Path, keep) -> Path:
    """The committed vllm serve run cut to the points ``keep(summary)`` selects."""
    d = tmp / "calib"
    d.mkdir()
    for name in ("config.yaml", "manifest.json"):
        shutil.copy(SERVER / name, d / name)
    summary = pd.read_csv(SERVER / "summary.csv")
    summary[keep(summary)].to_csv(d / "summary.csv", index=False)
    req = read_table(SERVER / "requests.parquet")
    req[keep(req)].to_parquet(d / "requests.parquet")
    return d


def test_a_run_with_one_unsaturated_rate_is_refused(tmp_path):
    # OFF at 16 and 32 req/s: 32 saturated, so one load is left to fit four coefficients.
    d = one_rate_run(tmp_path, lambda df: (df["mode"] == "off") & df["rate"].isin([16.0, 32.0]))
    req, summary = fr.load_run(d)
    with pytest.raises(UserError) as e:
        tf.check_loads(fr.fit_points(req, summary), str(d))
    assert str(e.value) == (f"--calibration {d}: a fit from request timestamps needs unsaturated points at 2 or "
                            f"more request rates to tell a step's fixed cost from its cost per decode token; the "
                            f"run has 1 (rates: 16)")


def test_the_cli_refuses_a_run_at_one_rate_in_one_line(tmp_path):
    d = one_rate_run(tmp_path, lambda df: df["rate"] == 4.0)
    (tmp_path / "c.yaml").write_text(yaml.safe_dump({**yaml.safe_load((d / "config.yaml").read_text()),
                                                      "model": str(REPO / "prefixstudy/configs/models/mistral-7b-v0.3")}))
    r: subprocess.CompletedProcess = forkcli.run(("simulate", tmp_path / "c.yaml", "--calibration", d, "--out",
                                                  tmp_path / "out"), cwd=REPO, timeout=300)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2, r.stderr
    assert lines[-1] == (f"error: --calibration {d}: a fit from request timestamps needs unsaturated points at 2 or "
                         f"more request rates to tell a step's fixed cost from its cost per decode token; the run "
                         f"has 1 (rates: 4)"), r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "out").exists()


def test_the_coordinate_search_walks_to_a_known_minimum():
    """A loss whose minimum is at c0 = 3, decode 0.05, the rest 0, from a guess off in every term."""
    want = {"c0": 3.0, "prefill_tokens": 0.0, "num_prefill_reqs": 0.0, "decode_tokens": 0.05}

    def evaluate(x):
        d = [x[k] / max(want[k], 1.0) - want[k] / max(want[k], 1.0) for k in want]
        return pd.DataFrame({"tpot_ms_err": [np.expm1(v) for v in d], "ttft_ms_err": [0.0] * 4})

    res = tf.search(evaluate, {"c0": 2.0, "prefill_tokens": 0.02, "num_prefill_reqs": 0.3, "decode_tokens": 0.03},
                    ref={"c0": 0.1, "prefill_tokens": 0.01, "num_prefill_reqs": 0.1, "decode_tokens": 0.01},
                    min_step=1e-4, max_evals=400)
    assert res.x["prefill_tokens"] == 0.0 and res.x["num_prefill_reqs"] == 0.0  # clipped at 0, not below
    assert res.x["c0"] == pytest.approx(3.0, abs=1e-3) and res.x["decode_tokens"] == pytest.approx(0.05, abs=1e-3)
    assert res.loss < 1e-3 and res.n_evals <= 400


def test_a_cost_model_without_a_fit_error_reads_as_before(tmp_path):
    """cost_model.json files written before the field exist load with an empty fit_error."""
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"c0_ms": 1.0, "coef_ms": {"decode_tokens": 0.1}}))
    assert CostModel.load(path).fit_error == {}
    assert fr.fit_error_line(tmp_path) == ""


@pytest.mark.slow  # a simulated run and two simulations of its points
def test_a_pipelined_run_is_reproduced_only_by_a_pipelined_fit(tmp_path):
    """A run the simulator made with the ``TRUTH`` price on vLLM's async engine (step N+1 scheduled
    while N runs, no host launch): the fit's own simulator, given that host part, gives every point
    back exactly; built one step at a time, with the same prices, it does not (each first token one
    step earlier).  experiments/sim/timestamps.py --pipelined fits committed runs this way."""
    from prefixstudy.costmodel.step_cost import HOST_OVERLAP
    from prefixstudy.sim.sessions import SimTarget
    from prefixstudy.workloads import load_rows

    host = {"c0_ms": 0.0, "coef_ms": {}, "overlap": HOST_OVERLAP}
    truth = fr.cost_model(TRUTH, host=host)
    assert truth.pipelined and truth.host == host and truth.host_ms(None) == 0.0
    truth.transfer = {"target": {"model": TINY, "gpu": "cpu", "tp": 1}}
    truth.save(tmp_path / "truth.json")
    cfg = load_config(None, {**OVERRIDES, "sweep.rates": [20, 120], "sweep.modes": ["off"], "sweep.num_requests": 20})
    run = simulate(cfg, tmp_path / "truth.json", out=tmp_path / "out")
    req, summary = fr.load_run(run)
    points = fr.fit_points(req, summary)
    rows = load_rows(cfg)

    def errors(cost):
        target = SimTarget("cpu", 1, 256, 16, cost)
        return tf.point_errors(fr.PointSimulator(cfg, rows, target, points, fr.MAX_REQUESTS).run(cost), points)

    err = errors(truth)
    assert np.abs(err[["ttft_ms_err", "tpot_ms_err", "e2e_ms_err"]].to_numpy()).max() < 1e-12
    sync = errors(fr.cost_model(TRUTH))
    assert (sync["ttft_ms_err"] < -0.05).all()  # a step sooner: the sync engine hands out its token at once

