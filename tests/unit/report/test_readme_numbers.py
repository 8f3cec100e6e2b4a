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


def test_a_changed_number_is_caught(tmp_path):
    m = _module()
    block = m.headline_block()
    assert "req/s" in block and block.startswith(m.BEGIN) and block.endswith(m.END)
    wrong = block.replace(" ms, **", " ms, **9", 1)
    assert wrong != block and m.replace_block(wrong, block) == block  # a stale block is replaced whole
