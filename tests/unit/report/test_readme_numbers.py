"""README.md's headline numbers are the committed files' (experiments/readme_numbers.py renders
them with the report's definitions); after a study is re-run, regenerate with
``python experiments/readme_numbers.py --write``."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


def _module():
    spec = importlib.util.spec_from_file_location("readme_numbers", REPO / "experiments/readme_numbers.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_readme_headline_block_is_what_the_committed_files_give():
    m = _module()
    text = (REPO / "README.md").read_text()
    block = m.headline_block()
    assert m.BEGIN in text and m.END in text
    assert m.replace_block(text, block) == text, "README.md's headline block is stale: run experiments/readme_numbers.py --write"


@pytest.mark.slow
def test_results_readme_tables_are_what_the_committed_files_give():
    m = _module()
    for path, text in m.regenerated().items():
        assert path.read_text() == text, f"{path}: stale; run experiments/readme_numbers.py --write"


def test_the_tables_count_the_repeats_each_mode_ran():
    """h200-tp1 ran 2 repeats a mode at every rate, and OFF saturated in both from 32 req/s on: the
    table counts what ran ("2 of 2", "0 of 2"), never a configured repeat count."""
    t = _module().study_table("h200-tp1")
    rows = {line.split(" | ")[0].lstrip("| ").split()[0]: line for line in t.splitlines()
            if line.startswith("| ") and line[2].isdigit()}
    assert sorted(rows, key=float) == ["1", "8", "16", "20", "24", "32", "48"]
    assert all(" | 2 / 2 | " in r for r in rows.values())
    assert [r for r, line in rows.items() if " | 2 of 2 | " in line] == ["32", "48"]
    assert [r for r, line in rows.items() if " | 0 of 2 | " in line] == ["1", "8", "16", "20", "24"]


def test_a_changed_number_is_caught(tmp_path):
    m = _module()
    block = m.headline_block()
    assert "req/s" in block and block.startswith(m.BEGIN) and block.endswith(m.END)
    wrong = block.replace(" ms, **", " ms, **9", 1)
    assert wrong != block and m.replace_block(wrong, block) == block  # a stale block is replaced whole


def test_the_async_engine_is_lower_by_what_the_readme_says():
    """vLLM's default (async) engine against the sync one on the same GPU: (sync - async) / sync of
    mean E2E, positive where async is faster.  The README once had it backwards ("34-64 % lower",
    the sync engine's excess over async)."""
    m = _module()
    low = m.async_lower(m.RESULTS / "h200-tp1", m.RESULTS / "h200-tp1-async")
    assert list(low.index) == [("off", 1.0), ("off", 16.0), ("on", 1.0), ("on", 16.0)]
    assert low.round(1).tolist() == [26.5, 39.0, 25.4, 30.0]
    assert "mean E2E was 25–39 % lower than with it off, as below" in m.headline_block()
