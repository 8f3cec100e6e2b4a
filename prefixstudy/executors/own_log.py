"""A Ray actor's own output, kept when its engine fails to start.

A Ray worker's stdout and stderr are files in its node's session logs, and the processes it starts
(vLLM's engine core) write to the same files.  Without -v nobody reads them: on 2 x H200 a fleet
whose engines did not start left only vLLM's "Engine core initialization failed. See root cause
above.", and the cause stayed on a machine that was gone by then.  So an actor notes where its
files end when it is created, and when its engine fails it reads what came since: the failure
carries it to the driver (``StudyFailed.log``), the run saves it, and ``errors.root_cause`` puts
its last exception line into the one-line error.
"""

from __future__ import annotations

import os

from prefixstudy.errors import LOG_BYTES, log_end


class OwnLog:
    """This process's stdout and stderr files from the moment of construction (none when they are
    a terminal or a pipe: then the output is on a console already)."""

    def __init__(self):
        self.files: dict[str, int] = {}
        for fd in (1, 2):
            try:
                path = os.readlink(f"/proc/self/fd/{fd}")
                if os.path.isfile(path):
                    self.files.setdefault(path, os.path.getsize(path))
            except OSError:  # no /proc (not Linux), or a closed descriptor
                continue

    def since(self, max_bytes: int = LOG_BYTES) -> str:
        """What the files gained since construction (the last ``max_bytes`` of each), each under a
        ``==> path <==`` line, as `tail` heads several files."""
        parts = []
        for path, start in self.files.items():
            text = log_end(path, start, max_bytes)
            if text.strip():
                parts.append(f"==> {path} <==\n{text.rstrip()}\n")
        return "\n".join(parts)
