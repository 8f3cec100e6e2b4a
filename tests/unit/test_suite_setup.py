"""The suite's own set-up (tests/conftest.py): what the xdist workers share of vLLM's cache, and the
suite's time as docs/tests.md gives it."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import _share_model_infos

REPO = Path(__file__).resolve().parents[2]


def test_a_workers_cache_root_reads_and_writes_the_default_roots_model_infos(tmp_path):
    default, root = tmp_path / "vllm", tmp_path / "vllm" / "pytest-gw1"
    (root / "modelinfos").mkdir(parents=True)  # the worker's own folder, from an older checkout
    (root / "modelinfos" / "old.json").write_text("{}")
    _share_model_infos(root, default)
    _share_model_infos(root, default)  # the next session's worker: left as it is
    link = root / "modelinfos"
    assert link.is_symlink() and link.resolve() == (default / "modelinfos").resolve()
    (link / "written-by-the-worker.json").write_text("{}")
    (default / "modelinfos" / "written-by-make-demo.json").write_text("{}")
    assert sorted(p.name for p in (default / "modelinfos").iterdir()) == \
        sorted(p.name for p in link.iterdir()) == ["written-by-make-demo.json", "written-by-the-worker.json"]


def test_docs_give_the_last_ten_fresh_clones_make_test_range():
    """docs/tests.md's time for `make test` is the range, in whole minutes, of the last ten fresh-clone
    records (benchmarks/results/fresh_clone_runN.txt, N highest)."""
    runs = sorted((REPO / "benchmarks/results").glob("fresh_clone_run*.txt"),
                  key=lambda p: int(re.search(r"run(\d+)", p.name).group(1)))[-10:]
    secs = [int(re.search(r"^make test: exit \d+ in (\d+) s", p.read_text(), re.M).group(1)) for p in runs]
    assert len(secs) == 10
    docs = (REPO / "docs/tests.md").read_text()
    assert f"({round(min(secs) / 60)} to {round(max(secs) / 60)} minutes on 2 cores\n" in docs, (min(secs), max(secs))
