"""A disk that fills mid-run: one line, exit 1, the manifest `failed` with the reason, the points
before it intact, and `--resume` goes on once there is room.  The disk "fills" through a hook in a
subprocess: from the second point's first part on, every write of the results store fails with
ENOSPC, as on a full filesystem; the manifest's in-place overwrite (no new blocks) still works."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
DRIVER = textwrap.dedent('''
    import errno, sys
    from prefixstudy.results import store
    from prefixstudy.shared import files
    write_parquet, temp_beside = store.atomic_write_parquet, store._temp_beside
    full = []

    def parquet(path, *a, **k):
        if path.name.startswith("on-100") or full:
            full.append(1)
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return write_parquet(path, *a, **k)

    def temp(path):
        if full:
            raise OSError(errno.ENOSPC, "No space left on device", str(path.parent))
        return temp_beside(path)

    store.atomic_write_parquet, store._temp_beside, files._temp_beside = parquet, temp, temp
    sys.argv = ["prefixstudy"] + sys.argv[1:]
    from prefixstudy.cli import entrypoint
    entrypoint()
''')


@pytest.mark.slow
def test_a_full_disk_is_one_line_and_the_manifest_says_so(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({
        "study": "full", "executor": "local", "out": str(tmp_path / "res"), "engine": {"kind": "echo"},
        "dataset": {"num_requests": 4, "prefix_len": 32, "suffix_len": 4, "output_len": 2},
        "sweep": {"rates": [50, 100], "modes": ["on"], "num_requests": 4, "warmup_requests": 0}}))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    r = subprocess.run([sys.executable, "-c", DRIVER, "run", cfg, "--quiet", "--no-report"], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=120)
    (d,) = (tmp_path / "res" / "full").iterdir()
    part = d / "requests.parquet" / "on-100.parquet"
    assert r.returncode == 1
    assert r.stderr == (f"error: disk full (No space left on device: {part}); free space first; finished points are "
                        f"saved; continue with: prefixstudy run --resume {d}\n")
    m = json.loads((d / "manifest.json").read_text())
    assert (m["status"], m["error"]) == ("failed", f"failed: disk full ([Errno 28] No space left on device: '{part}')")
    assert [(p["rate"], p["status"]) for p in m["points"]] == [(50.0, "ok")]
    assert len(pd.read_parquet(d / "requests.parquet" / "on-50.parquet")) == 4

    again = subprocess.run([sys.executable, "-m", "prefixstudy", "run", "--resume", d, "--quiet", "--no-report"],
                           cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    m = json.loads((d / "manifest.json").read_text())
    assert (m["status"], [p["status"] for p in m["points"]]) == ("complete", ["ok", "ok"])
