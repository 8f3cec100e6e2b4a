"""The committed studies, summarised again by today's code, give their committed summary.csv.

This pins the definitions (counted request, saturation, hit rate, percentiles) across refactors:
a column whose meaning changes on purpose must be listed here, with the reason.

Definitions chosen on purpose, which every committed summary.csv carries:
* ``saturated`` / ``saturation_reason``: the engine ran full (the requests in the system at 90 % of
  the admission limit, which ``experiments/resummarize.py`` records in each manifest point from the
  config's ``max_num_seqs``), requests waited for admission, completions fell behind or a request
  was left open (``metrics.saturation``); the thirds of the window are reported, not a verdict.
  The engine columns come from the study-wide step-cost fit (``results.finish``), so they are
  compared after the same fit.
* Without engine steps and a known limit (an ``http`` server whose ``max_num_seqs`` is not given)
  a trend test on the client's requests in flight decides; ``vllm-server`` records its limit, so
  h200-vllm-server's OFF 32 req/s points are flagged by running full.
* The engine columns (``engine_prefill_share*``, ``decode_slowdown*``) come from a non-negative
  least-squares fit (``costmodel.engine_fit``), because a step that computes more cannot cost less:
  where plain least squares made a term negative (h200-multiturn's prefill-request term, the
  h200-cache-pressure runs) the shares differ, and elsewhere the intervals differ where a bootstrap
  refit had a negative term; a fleet's steps are resampled in blocks of one replica's steps.
  Every committed summary.csv was regenerated with ``experiments/resummarize.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from tests.scripts import load_script
from tests.tables import assert_same_table

REPO = Path(__file__).resolve().parents[3]
RESULTS = REPO / "experiments/results"
# Every committed study folder, the runs of every committed capacity sweep, and each policy's run of
# every committed routing sweep (h200-smoke-after-layout holds runs of an older layout, before
# repeats: its own README section says what they show).
# The simulated seed studies keep only their tables in git (their records rebuild by one command).
RUNS = sorted(str(p.relative_to(RESULTS)) for p in load_script("experiments/resummarize.py").runs())


@pytest.mark.slow
@pytest.mark.parametrize("run", RUNS)
def test_committed_summary_is_reproduced(run):
    from prefixstudy.costmodel.engine_fit import fit_step_cost
    from prefixstudy.metrics.summary import add_engine_columns, summarize
    from prefixstudy.results.migrate import migrate
    from prefixstudy.schema import typed_iterations

    d = REPO / "experiments/results" / run
    manifest = json.loads((d / "manifest.json").read_text())
    frames, manifest = migrate({"requests": pd.read_parquet(d / "requests.parquet"),
                                "iterations": pd.read_parquet(d / "iterations.parquet")}, manifest)
    req, it, points = frames["requests"], frames["iterations"], manifest["points"]
    committed = pd.read_csv(d / "summary.csv", converters={"error": str, "status": str, "mode": str,
                                                            "saturation_reason": str, "step_timing": str})
    tol = 0.05
    got = summarize(req, points, tol, it)
    its = typed_iterations(it)
    got = add_engine_columns(got, its, fit_step_cost(its))
    assert_same_table(got, committed, run)


def test_runs_found():
    pressure = [f"h200-cache-pressure/groups-{g}/blocks-{c}" for g, cs in ((40, (4400, 4800, 5200, 6400)),
                                                                         (48, (5600, 6400))) for c in cs]
    assert RUNS == ["cpu-default", "cpu-replicas/policy-prefix_affinity", "cpu-replicas/policy-round_robin",
                    "h100-tp1", "h100-tp1-capacity", "h100-tp1-spans", "h100-vllm-server", "h200-cache-pressure-spans",
                    "h200-cache-pressure-spans-4400", *pressure,
                    "h200-multiturn", "h200-multiturn-spans", "h200-multiturn-sync", "h200-offload",
                    "h200-offload-fits", "h200-sglang",
                    *(f"h200-shared-fraction/shared_fraction-{f}" for f in ("0", "0.5", "0.95")),
                    "h200-tp1", "h200-tp1-async", "h200-tp1-fixed-order", "h200-tp1-gc", "h200-tp1-ray", "h200-tp1-slo",
                    "h200-tp1-sync", "h200-tp2", "h200-vllm-server"]


SEARCHED = sorted(str(p.parent.relative_to(RESULTS)) for p in RESULTS.rglob("manifest.json")
                  if "capacity_search" in json.loads(p.read_text()))


@pytest.mark.parametrize("run", SEARCHED)
def test_a_committed_capacity_search_says_what_its_points_say(run):
    """capacity.csv and the manifest's search state, derived again from the committed points and
    summary rows by today's search: the brackets the README renders are the code's."""
    from prefixstudy.config import load_config
    from prefixstudy.metrics import capacity_search as cap
    from prefixstudy.schema import point_key

    d = RESULTS / run
    manifest, cfg = json.loads((d / "manifest.json").read_text()), load_config(d / "config.yaml")
    rows = {point_key(r): r for r in pd.read_csv(d / "summary.csv").to_dict("records")}
    found = cap.search_arms(manifest["points"], rows, cfg.sweep.capacity_search, cfg.sweep.modes)
    assert json.loads(json.dumps(cap.manifest_record(cfg.sweep.capacity_search, found))) == manifest["capacity_search"]
    got = pd.DataFrame(cap.capacity_rows(found, cfg.sweep.baseline_arm()), columns=cap.COLUMNS)
    assert_same_table(got, pd.read_csv(d / "capacity.csv"), run)
    assert set(got["stopped"]) <= set(cap.STOP_REASONS)  # every arm's search finished
