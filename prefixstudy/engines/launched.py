"""A server that prefixstudy launches per arm and measures over HTTP (``vllm-server``,
``sglang-server``): the process, its log and its end; the requests, resets and /metrics go through
``engines.http``.

The server runs in its own process group and is killed on every exit path: ``shutdown`` (which the
runner's ``async with`` reaches on errors and Ctrl-C), ``atexit``, and the kernel's parent-death
signal if this process dies without either.  Its log is kept only when it did not come up (it
travels with the failure) or exited during the run.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import math
import os
import signal
import socket
import subprocess
import tempfile
import time
from typing import Any

from prefixstudy.engines import ipc
from prefixstudy.engines.base import EngineDefaults, IterationSample, RequestTrace
from prefixstudy.engines.http import HttpEngine, HttpEngineConfig
from prefixstudy.errors import StudyFailed, first_line, log_end, root_cause

log = logging.getLogger(__name__)


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """In the child, before exec: the kernel sends SIGTERM when this (the parent) process dies."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 - best effort in the child before exec; must never stop the launch
        pass


def kill_group(proc: subprocess.Popen, grace_s: float = 15.0) -> None:
    """SIGTERM the server's whole process group (API server and engine processes), SIGKILL after grace_s."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)
    except ProcessLookupError:
        pass


def _tail(text: str, n: int = 3) -> str:
    """A log's last non-empty lines, joined on one line."""
    return " | ".join([ln.strip() for ln in text.splitlines() if ln.strip()][-n:])


class LaunchedServerEngine(EngineDefaults):
    """One mode's own server process, measured through ``HttpEngine``.  A backend says how to
    launch it (``command``, ``launch_env``) and how to reach it (``http_config``)."""

    server_name = "server"  # in messages: `vllm serve`, `sglang`

    def __init__(self, model: str, engine, mode: str, *, ray_workers: bool = False):
        self.model, self.config, self.mode = model, engine, mode
        self.ray_workers = ray_workers
        self.proc: subprocess.Popen | None = None
        self.http: HttpEngine | None = None
        self.block_size = 0
        self.num_blocks = 0  # the server's KV-cache blocks once started (0: unknown)
        self.startup_s = math.nan
        self.log_path = ""
        self.ipc_dir = ""  # the server's folder of IPC sockets (``ipc_env``), removed when it stops

    # ------------------------------------------------------------------ what a backend says
    # The variable that names the folder where the server binds its IPC socket files, for a server
    # whose own files outlive it (``engines.ipc``); None: the server keeps them to itself.
    ipc_env: str | None = None

    def command(self, port: int) -> list[str]:
        raise NotImplementedError

    def launch_env(self) -> dict[str, str]:
        """Variables added to this process's environment for the server."""
        return {}

    def http_config(self, url: str) -> HttpEngineConfig:
        raise NotImplementedError

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        t0 = time.monotonic()
        port = free_port(self.config.host) if getattr(self.config, "port", None) is None else self.config.port
        cmd = self.command(port)
        logf = tempfile.NamedTemporaryFile("wb", prefix=f"prefixstudy-{self.kind}-{self.mode}-", suffix=".log",
                                           delete=False)
        self.log_path = logf.name
        env = {**os.environ, **self.launch_env()}
        ipc.remove_stale()
        self.ipc_dir = ipc.own_dir() if self.ipc_env is not None and self.ipc_env not in env else ""
        if self.ipc_dir:
            env[self.ipc_env] = self.ipc_dir
        with logf:
            self.proc = subprocess.Popen(cmd, env=env,
                                         stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
                                         start_new_session=True, preexec_fn=_die_with_parent)  # noqa: PLW1509 - prctl(PDEATHSIG) only, no locks
        atexit.register(self.shutdown)
        url = f"http://{self.config.host}:{port}"
        self.http = HttpEngine(self.model, self.http_config(url), self.mode)
        self.http.alive = lambda: self.proc is not None and self.proc.poll() is None
        try:
            await self.http.start()
        except Exception as e:  # noqa: BLE001 - any start failure: server shut down, re-raised as StudyFailed with its log
            self._stop()
            # The log travels with the failure (a Ray actor's temp file is on a node that may be
            # gone by the time anyone looks); the run keeps it.  Without an exception line in it
            # (a server killed from outside), its last lines go into the message instead.
            text = log_end(self.log_path)
            self._drop_log()
            why = "" if root_cause(text) else f"; the end of its log: {_tail(text)}"
            raise StudyFailed(f"{self.server_name} (caching {self.mode.upper()}) did not come up: {first_line(e)}{why}",
                              log=text) from None
        self.block_size, self.startup_s = self.http.block_size, time.monotonic() - t0
        self.num_blocks = self.http.num_blocks
        log.info("server %s up in %.1f s at %s (block size %s)", self.mode, self.startup_s, url, self.block_size)

    # ------------------------------------------------------------------ the HTTP engine does the rest
    async def reset_prefix_cache(self) -> bool:
        return await self.http.reset_prefix_cache()

    def set_cache_salt(self, salt: str) -> None:
        self.http.set_cache_salt(salt)

    def begin_iterations(self) -> None:
        self.http.begin_iterations()

    def end_iterations(self) -> list[IterationSample]:
        return self.http.end_iterations()

    async def begin_point(self) -> None:
        await self.http.begin_point()

    async def end_point(self) -> dict[str, Any]:
        return await self.http.end_point()

    async def generate(self, prompt_token_ids: list[int], output_len: int, request_id: str,
                       trace: RequestTrace) -> RequestTrace:
        return await self.http.generate(prompt_token_ids, output_len, request_id, trace)

    async def aclose(self) -> None:
        if self.http is not None:
            await self.http.aclose()

    def is_dead(self) -> bool:
        return self.proc is None or self.proc.poll() is not None or (self.http is not None and self.http.is_dead())

    def shutdown(self) -> None:
        crashed = self.proc is not None and self.proc.poll() is not None
        self._stop()
        if crashed:  # it exited on its own: its log is the only account of why
            log.warning("%s (caching %s) exited during the run; its log: %s", self.server_name, self.mode.upper(),
                        self.log_path)
        else:
            self._drop_log()

    def _stop(self) -> None:
        if self.http is not None:
            self.http.shutdown()
        if self.proc is not None:
            kill_group(self.proc)
            self.proc = None
        ipc.remove(self.ipc_dir)
        self.ipc_dir = ""
        atexit.unregister(self.shutdown)

    def _drop_log(self) -> None:
        if self.log_path:
            with contextlib.suppress(OSError):
                os.unlink(self.log_path)
            self.log_path = ""
