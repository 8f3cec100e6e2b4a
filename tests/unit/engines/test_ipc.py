"""An engine's files in the temp folder name their owner, and an engine start removes those whose
owner is gone: a process killed outright (a Ray actor killed or out of memory) removes nothing
itself, and its step log grows with every step it ran."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from prefixstudy.engines import ipc

MAKE = ("from prefixstudy.engines import ipc; import time; "
        "print(ipc.own_dir(), ipc.own_step_log('on'), flush=True); time.sleep(120)")


def _child(tmp: Path) -> tuple[subprocess.Popen, list[str]]:
    """A process that made its socket folder and its step log in ``tmp``, then waits."""
    p = subprocess.Popen([sys.executable, "-c", MAKE], stdout=subprocess.PIPE, text=True,
                         env={**os.environ, "TMPDIR": str(tmp)})
    return p, [Path(x).name for x in p.stdout.readline().split()]


def test_what_a_process_that_is_gone_left_is_removed_and_nothing_else(monkeypatch):
    # short, as a temp folder is: a socket path in pytest's tmp_path would exceed AF_UNIX's 107 bytes
    tmp_path = Path(tempfile.mkdtemp(prefix="ps-ipc-", dir="/tmp"))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    killed, killed_files = _child(tmp_path)
    zombie, zombie_files = _child(tmp_path)
    alive, alive_files = _child(tmp_path)
    try:
        killed.kill()
        killed.wait()
        os.kill(zombie.pid, signal.SIGKILL)  # not reaped: an exited process whose pid is still taken
        while Path(f"/proc/{zombie.pid}/stat").read_text().rsplit(") ", 1)[1][0] != "Z":
            pass
        mine = [Path(ipc.own_dir()).name, Path(ipc.own_step_log("off")).name]
        ns = os.stat("/proc/self/ns/pid").st_ino
        # another pid namespace's (a container sharing the folder): its pid means nothing here
        (tmp_path / f"prefixstudy-steps-{ns + 1}-{killed.pid}-x-on.bin").touch()
        (tmp_path / "prefixstudy-vllm-server-on-x.log").touch()  # a crashed server's log, kept for its reader
        assert [n.split("-")[:4] for n in killed_files] == [["prefixstudy", "ipc", str(ns), str(killed.pid)],
                                                            ["prefixstudy", "steps", str(ns), str(killed.pid)]]
        assert killed_files[1].endswith("-on.bin") and (tmp_path / killed_files[0]).is_dir()

        assert sorted(ipc.remove_stale()) == sorted(killed_files + zombie_files)
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
            alive_files + mine + [f"prefixstudy-steps-{ns + 1}-{killed.pid}-x-on.bin", "prefixstudy-vllm-server-on-x.log"])
        assert ipc.remove_stale() == []
    finally:
        for p in (killed, zombie, alive):
            p.kill()
            p.wait()
        shutil.rmtree(tmp_path)
