"""The tables at a capacity or routing sweep's parent folder hold exactly the columns the docs'
results reference lists (docs/hooks/reference.py, ``sweep_files``), with its types: a real capacity
sweep and a real routing sweep on the echo backend are written and read back as a reader gets them
(text columns as text, the rest as pandas infers them from the CSV)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pandas as pd
import pytest

from tests.scripts import load_script
from tests.sweeps import capacity_sweep

from prefixstudy.config import load_config
from prefixstudy.report.capacity import write_capacity_report
from prefixstudy.report.routing import routing_report
from prefixstudy.sweep.run_sweep import run_sweep

# Two sweeps, five engine sessions: seconds, so the file runs in `make test`, not `make test-fast`.
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[3]
KIND = {"str": "O", "bool": "b", "int64": "i", "float64": "f"}
ECHO = {"engine": {"kind": "echo", "block_size": 16}, "executor": "local", "arrivals.process": "constant",
        "dataset.kind": "groups", "sweep.warmup_requests": 0, "sweep.rates": [50]}
# Six groups of two 16-token prefix blocks: 12 shared blocks, so 14 blocks hold them and 12 do not.
CAPACITY = {**ECHO, "dataset.groups": 6, "dataset.prefix_len": 32, "dataset.suffix_len": 4, "dataset.output_len": 2,
            "sweep.num_requests": 12}
ROUTING = {**ECHO, "replicas": 2, "dataset.groups": 3, "dataset.prefix_len": 64, "dataset.suffix_len": 8,
           "dataset.output_len": 4, "sweep.num_requests": 6, "router.policies": ["round_robin", "prefix_affinity"],
           "router.off_policies": ["round_robin"]}
# Rows each file must have: 2 capacities x (ON, OFF); policies x arms (affinity runs ON only); x 2 replicas.
ROWS = {"capacity.csv": 4, "routing.csv": 3, "replicas.csv": 6, "replicas_summary.csv": 6}


def _hook():
    return load_script("docs/hooks/reference.py")


@pytest.fixture(scope="module")
def parents(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("sweeps")
    cap = capacity_sweep(load_config(None, {**CAPACITY, "out": str(out)}), "blocks", [14, 12], out / "capacity")
    write_capacity_report(cap)
    rt = run_sweep(load_config(None, {**ROUTING, "out": str(out)}), run_dir=out / "routing", progress=False)
    routing_report(rt)
    return {"capacity.csv": cap, "routing.csv": rt, "replicas.csv": rt, "replicas_summary.csv": rt}


def test_the_reference_covers_every_table_a_sweep_writes_at_its_parent(parents):
    written = {p.name for parent in set(parents.values()) for p in parent.iterdir() if p.suffix == ".csv"}
    assert written == {name for name, _, _ in _hook().sweep_files()} == set(ROWS)


@pytest.mark.parametrize("name", list(ROWS))
def test_every_column_written_is_documented_with_its_type(parents, name):
    fields = {n: f for n, _, f in _hook().sweep_files()}[name]
    text = [c for c, (t, _) in fields.items() if t == "str"]
    df = pd.read_csv(parents[name] / name, dtype=dict.fromkeys(text, str))
    assert len(df) == ROWS[name]
    # capacity.csv's policy is written only by a sweep of several routing policies (tests/unit/sweep/test_capacity_axis.py)
    fields = {c: f for c, f in fields.items() if not (name == "capacity.csv" and c == "policy")}
    assert list(df.columns) == list(fields)
    assert {c: df[c].dtype.kind for c in df.columns} == {c: KIND[t] for c, (t, _) in fields.items()}
    assert all(doc.strip() for _, doc in fields.values())


def test_a_capacity_sweep_records_its_capacities_and_blocks(parents):
    """The sweep's own columns, as written: the two capacities, the blocks the engine had, the
    working set against them (12 shared blocks over 13 and 11 usable ones)."""
    t = pd.read_csv(parents["capacity.csv"] / "capacity.csv")
    on = t[t["mode"] == "on"]
    assert on["capacity"].tolist() == on["num_blocks"].tolist() == [14.0, 12.0]
    assert on["working_set_ratio"].tolist() == pytest.approx([12 / 13, 12 / 11])
    assert t["tier_blocks"].tolist() == [0, 0, 0, 0]
    assert t[t["mode"] == "off"]["e2e_gain"].isna().all() and on["e2e_gain"].notna().all()


def test_the_results_page_has_one_row_per_sweep_column():
    hook = _hook()
    page = hook.results_page()
    for name, _, fields in hook.sweep_files():
        section = page.split(f"## `{name}`", 1)[1].split("\n## ", 1)[0]
        rows = [line for line in section.splitlines() if line.startswith("| `")]
        assert [r.split("`")[1] for r in rows] == list(fields)
