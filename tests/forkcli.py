"""`python -m prefixstudy ARGS` as a real child process, without paying for its imports each time.

A CLI test needs a process of its own: its exit code, what reaches its stderr, and that no
traceback gets out are the claims.  Starting Python and importing prefixstudy with pandas, pyarrow
and pydantic costs about a second of CPU a call, and the bad-input corpus alone makes 149 calls.
So a server process imports all of that once, and the report's modules with matplotlib (another
0.3 s, in about one call in five), and forks a child for each call (one server per call running at
the same time: a thread pool of three calls keeps three).
The child is a process like any other: it takes the call's working directory and environment,
writes to its own stdout and stderr, runs ``python -m prefixstudy``'s own ``__main__``, runs its
atexit handlers and exits with the CLI's code.  An uncaught exception prints its traceback and
exits 1, as the interpreter would.

What a fork cannot show is an import that fails or prints at start-up: those claims
(tests/unit/cli/test_missing_packages.py, tests/unit/costmodel/test_roofline.py) start a fresh
interpreter, and so do the tests that run the installed ``prefixstudy`` script.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

_SERVER = r"""
import atexit, json, os, runpy, signal, sys, traceback
import numpy, pandas, pyarrow, pyarrow.parquet, pydantic, yaml, click  # noqa: F401 - the point of the server
import prefixstudy.cli, prefixstudy.config, prefixstudy.study.orchestrate, prefixstudy.results, prefixstudy.report  # noqa: F401
requests, replies = os.fdopen(int(sys.argv[1]), "r"), os.fdopen(int(sys.argv[2]), "w")
for line in requests:
    call = json.loads(line)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            requests.close()
            replies.close()
            os.chdir(call["cwd"])
            os.environ.clear()
            os.environ.update(call["env"])
            with open(call["stdout"], "wb") as out, open(call["stderr"], "wb") as err:
                os.dup2(out.fileno(), 1)
                os.dup2(err.fileno(), 2)
            if call["sigint"]:  # what a fresh interpreter started with SIGINT at its default installs
                signal.signal(signal.SIGINT, signal.default_int_handler)
            try:
                if call["code"] is None:
                    sys.argv = [sys.executable, *call["args"]]
                    runpy.run_module("prefixstudy", run_name="__main__", alter_sys=True)
                else:  # python -c CODE ARGS
                    sys.argv = ["-c", *call["args"]]
                    exec(compile(call["code"], "<string>", "exec"), {"__name__": "__main__"})
                code = 0
            except SystemExit as e:
                if e.code is None or isinstance(e.code, int):
                    code = e.code or 0
                else:
                    print(e.code, file=sys.stderr)
            except BaseException:
                traceback.print_exc()
            atexit._run_exitfuncs()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    replies.write(json.dumps(pid) + "\n")
    replies.flush()
    _, status = os.waitpid(pid, 0)
    replies.write(json.dumps(os.waitstatus_to_exitcode(status)) + "\n")
    replies.flush()
"""


class _Server:
    """One server process; it runs one call at a time."""

    def __init__(self):
        req_r, req_w = os.pipe()
        rep_r, rep_w = os.pipe()
        self.proc = subprocess.Popen([sys.executable, "-c", _SERVER, str(req_r), str(rep_w)], cwd=REPO,
                                     env=dict(os.environ), pass_fds=(req_r, rep_w), stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL)
        os.close(req_r)
        os.close(rep_w)
        # Replies unbuffered: a buffered reader can take the pid line and the exit-code line in one
        # read, and the select() that waits for the exit code would then wait on an empty pipe until
        # its timeout (a CLI call that fails at once did: 600 s, fresh-clone run 24).
        self.requests, self.replies = os.fdopen(req_w, "w"), os.fdopen(rep_r, "rb", buffering=0)

    def _reply(self, timeout: float | None):
        if timeout is not None and not select.select([self.replies], [], [], timeout)[0]:
            return None
        line = self.replies.readline()
        if not line:
            raise RuntimeError(f"the CLI fork server died (exit {self.proc.wait(5)})")
        return json.loads(line)

    def call(self, payload: dict, timeout: float | None) -> int:
        self.requests.write(json.dumps(payload) + "\n")
        self.requests.flush()
        pid = self._reply(None)
        code = self._reply(timeout)
        if code is None:
            os.kill(pid, signal.SIGKILL)
            self._reply(None)
            raise subprocess.TimeoutExpired(payload["args"], timeout)
        return code

    def close(self) -> None:
        self.requests.close()
        self.proc.wait(30)


_idle: list[_Server] = []  # servers between calls; a call with none idle starts one
_lock = threading.Lock()


@atexit.register
def _close_all() -> None:
    while _idle:
        _idle.pop().close()


def run(args, *, cwd: Path | str = REPO, env: dict | None = None, timeout: float | None = None,
        code: str | None = None, sigint_default: bool = False) -> subprocess.CompletedProcess:
    """``subprocess.run([python, -m, prefixstudy, *args], cwd=cwd, env=env, capture_output=True,
    text=True, timeout=timeout)``, in a forked child of a server; with ``code``, ``python -c code
    *args``.  ``sigint_default``: Ctrl-C raises KeyboardInterrupt in the child even where this
    process ignores SIGINT (a suite started in the background).  Calls from several threads run
    side by side, each on a server of its own."""
    args = [str(a) for a in args]
    argv = [sys.executable, "-m", "prefixstudy", *args] if code is None else [sys.executable, "-c", code, *args]
    with _lock:
        server = _idle.pop() if _idle else None
    server = server if server is not None and server.proc.poll() is None else _Server()
    with tempfile.TemporaryDirectory(prefix="ps-cli-") as tmp:
        out, err = Path(tmp, "stdout"), Path(tmp, "stderr")
        rc = server.call({"args": args, "cwd": str(cwd), "env": dict(os.environ if env is None else env),
                            "stdout": str(out), "stderr": str(err), "code": code, "sigint": sigint_default}, timeout)
        with _lock:
            _idle.append(server)
        return subprocess.CompletedProcess(argv, rc, out.read_text(errors="replace"), err.read_text(errors="replace"))
