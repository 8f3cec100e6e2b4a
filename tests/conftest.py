"""Shared fixtures.  The engine study runs once per session, and its ON and OFF engines stay up for
the later studies with the same engine arguments (``pooled_study``)."""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tiny import TINY_OVERRIDES

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def engine_pool():
    """The session's kept engines (prefixstudy.engines.pool): the first two started inside it, the
    shared study's ON and OFF, stay up for every later study with the same engine arguments."""
    from prefixstudy.engines.pool import EnginePool

    pool = EnginePool(max_engines=2)
    yield pool
    pool.close()


@pytest.fixture(scope="session")
def tiny_study(tmp_path_factory, engine_pool):
    """A finished two-mode study on the real tiny engine; returns its results folder.  Its two
    engines are the pool's: they stay up for the studies that use ``pooled_study``."""
    from prefixstudy.config import load_config
    from prefixstudy.study import run_study

    cfg = load_config(REPO / "prefixstudy/configs/default.yaml", {**TINY_OVERRIDES, "out": str(tmp_path_factory.mktemp("res"))})
    with engine_pool.active():
        run = run_study(cfg, progress=False)
    assert (engine_pool.starts, engine_pool.reuses) == (2, 0)
    return run


@pytest.fixture(scope="session")
def pooled_study(tiny_study, engine_pool):
    """run_study on the shared engines: (cfg) -> results folder.  Its ON and OFF arms, when their
    engine arguments are TINY_ENGINE's, are served by the engines ``tiny_study`` started."""
    from prefixstudy.study import run_study

    def run(cfg):
        with engine_pool.active():
            return run_study(cfg, progress=False)

    return run


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
