"""README.md's headline numbers are the committed files' (experiments/readme_numbers.py renders
them with the report's definitions); after a study is re-run, regenerate with
``python experiments/readme_numbers.py --write``."""

from __future__ import annotations

import importlib.util
from pathlib import Path

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


def test_results_readme_tables_are_what_the_committed_files_give():
    m = _module()
    for path, text in m.regenerated().items():
        assert path.read_text() == text, f"{path}: stale; run experiments/readme_numbers.py --write"


def test_the_tables_count_the_repeats_each_mode_ran():
    """h200-tp1's OFF ran 2 repeats at 28 and 32 req/s: saturated "2 of 2", not "3 of 3"."""
    t = _module().study_table("h200-tp1")
    rows = {line.split(" | ")[0].lstrip("| "): line for line in t.splitlines() if line.startswith("| 28 ") or
            line.startswith("| 32 ")}
    assert all(" | 3 / 2 | " in r and " | 2 of 2 | " in r for r in rows.values()) and len(rows) == 2


def test_a_changed_number_is_caught(tmp_path):
    m = _module()
    block = m.headline_block()
    assert "req/s" in block and block.startswith(m.BEGIN) and block.endswith(m.END)
    wrong = block.replace(" ms, **", " ms, **9", 1)
    assert wrong != block and m.replace_block(wrong, block) == block  # a stale block is replaced whole
