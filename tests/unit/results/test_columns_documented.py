"""Every column a run writes is documented, and every documented column is written, with the type
the docs give it.  The docs' results reference (docs/hooks/reference.py, ``results_files``) prints
these tables; here a real run on the echo backend (three arms, so arms.csv is written too) is read
back and compared with them, file by file."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pandas as pd
import pytest

from tests.scripts import load_script

from prefixstudy.config import load_config
from prefixstudy.metrics.headline import HEADLINE_FIELDS, MODES, headline_columns
from prefixstudy.results import load
from prefixstudy.results.store import ARMS, HEADLINE, ITERATIONS, REQUESTS, SUMMARY, read_table
from prefixstudy.study.orchestrate import run_study

# Its module fixtures take seconds (studies, reports, venvs): the whole file runs in `make test`, not `make test-fast`.
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[3]
ECHO = {"engine": {"kind": "echo", "block_size": 16, "decode_ms_per_token": 0.2}, "executor": "local",
        "arrivals.process": "constant", "dataset.prefix_len": 56, "dataset.suffix_len": 8, "dataset.output_len": 4,
        "dataset.groups": 2, "sweep.num_requests": 6, "sweep.warmup_requests": 1, "sweep.rates": [40],
        "arms": [{"name": "on-bs32", "engine": {"block_size": 32}}]}
KIND = {"str": "O", "bool": "b", "int64": "i", "float64": "f"}


def _hook():
    return load_script("docs/hooks/reference.py")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return run_study(load_config(None, {**ECHO, "out": str(tmp_path_factory.mktemp("res"))}), progress=False)


def documented(fields: dict[str, tuple[str, str]]) -> dict[str, str]:
    """column -> dtype, ``{mode}`` spelled out for each of headline.csv's modes (``{arm}``: ON)."""
    return {c.format(mode=m, arm=MODES[0]): t for c, (t, _) in fields.items() for m in MODES}


def written(run: Path) -> dict[str, pd.DataFrame]:
    """Each table as a reader gets it: the parquet datasets as stored, the CSVs as results.load reads them."""
    res = load(run)
    return {REQUESTS: read_table(run / REQUESTS), ITERATIONS: read_table(run / ITERATIONS), SUMMARY: res.summary,
            HEADLINE: res.headline, ARMS: res.arms}


def test_the_reference_covers_every_table_a_run_writes(run):
    tables = {p.name for p in run.iterdir() if p.suffix in (".csv", ".parquet")}
    assert tables == {name for name, _, _ in _hook().results_files()} == {REQUESTS, ITERATIONS, SUMMARY, HEADLINE, ARMS}


@pytest.mark.parametrize("name", [REQUESTS, ITERATIONS, SUMMARY, HEADLINE, ARMS])
def test_every_column_written_is_documented_with_its_type(run, name):
    fields = {n: f for n, _, f in _hook().results_files()}[name]
    df = written(run)[name]
    assert len(df) > 0
    docs = documented(fields)
    assert list(df.columns) == list(docs) if name != HEADLINE else set(df.columns) == set(docs)
    kinds = {c: df[c].dtype.kind for c in df.columns}
    assert kinds == {c: KIND[t] for c, t in docs.items()}
    assert all(doc.strip() for _, doc in fields.values())


def test_headline_columns_spell_out_each_mode():
    cols = headline_columns()
    assert cols[:3] == ["rate", "n_repeats", "arrival_rate"]
    assert {"on_mean_e2e_ms", "off_mean_e2e_ms", "gain_mean_e2e", "on_hit_rate"} <= set(cols)
    assert len(cols) == sum(2 if "{mode}" in c else 1 for c in HEADLINE_FIELDS)


def test_the_results_page_has_one_row_per_column():
    page = _hook().results_page()
    for name, _, fields in _hook().results_files():
        section = page.split(f"## `{name}`", 1)[1].split("\n## ", 1)[0]
        rows = [line for line in section.splitlines() if line.startswith("| `")]
        assert [r.split("`")[1] for r in rows] == list(fields)
