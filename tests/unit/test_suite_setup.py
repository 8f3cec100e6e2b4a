"""The suite's own set-up (tests/conftest.py): what the xdist workers share of vLLM's cache."""

from __future__ import annotations

from tests.conftest import _share_model_infos


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
