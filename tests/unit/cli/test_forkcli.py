"""The CLI fork server the CLI tests run through (tests/forkcli.py): a call whose child has exited
before the caller reads the server's first reply line must still return at once."""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import pytest

from tests import forkcli


@pytest.mark.slow  # two seconds asleep, so that the child has exited
def test_a_reply_already_whole_in_the_pipe_is_read_without_waiting():
    """The server writes the child's pid, then its exit code.  A child that exits at once (a CLI
    call refused while parsing its flags) leaves both lines in the pipe before the caller reads the
    first; a buffered reader then holds the second in its buffer, where select() does not see it,
    and the call waited out its whole timeout (600 s in fresh-clone run 24)."""
    server = forkcli._Server()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            payload = {"args": [], "cwd": tmp, "env": {}, "stdout": str(Path(tmp, "out")),
                       "stderr": str(Path(tmp, "err")), "code": "raise SystemExit(3)", "sigint": False}
            server.requests.write(json.dumps(payload) + "\n")
            server.requests.flush()
            time.sleep(2)  # the child has long exited: both reply lines wait in the pipe
            assert isinstance(server._reply(None), int)
            t0 = time.monotonic()
            assert server._reply(5) == 3
            assert time.monotonic() - t0 < 1
    finally:
        server.close()
