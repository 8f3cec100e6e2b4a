"""Backend ``sglang-server``: prefixstudy launches SGLang's server (``python -m
sglang.launch_server``) per arm and measures it over HTTP with the ``sglang`` server profile
(``engines.http_config.PROFILES``).

Caching ON runs SGLang's RadixAttention (its default), caching OFF the same server with
``--disable-radix-cache``.  Every server gets ``--enable-cache-report`` (cached tokens per request in
``usage.prompt_tokens_details``, left null when nothing was cached) and ``--enable-metrics``
(``sglang:prompt_tokens_total`` / ``sglang:cached_tokens_total``, the ``server_*`` columns); between
points its cache is flushed through ``/flush_cache``.  The process, its log and its end are
``engines.launched``'s, as for ``vllm-server``.

SGLang needs the model's tokenizer: with ``--skip-tokenizer-init``, SGLang 0.5.17 answers
prefixstudy's token-id completions with HTTP 500 (KeyError 'text') and any ``min_tokens`` > 0 with
400, so the tokenizer folder (``tokenizer_path``, else the model's) must hold a tokenizer.json.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from prefixstudy.engines.base import EngineConfigBase, caching
from prefixstudy.engines.http import HttpEngineConfig
from prefixstudy.engines.launched import LaunchedServerEngine
from prefixstudy.errors import UserError, installed

SERVER_MODULE = "sglang.launch_server"
# Names another module to launch in its place, with the same flags: the tests' stand-in server.
SERVER_MODULE_ENV = "PREFIXSTUDY_SGLANG_SERVER_MODULE"
# Flags prefixstudy sets itself, and the field that sets each.
OWN_FLAGS = {"--model-path": "model_path", "--tokenizer-path": "tokenizer_path", "--host": "host", "--port": "port",
             "--context-length": "max_model_len", "--mem-fraction-static": "mem_fraction_static",
             "--attention-backend": "attention_backend", "--sampling-backend": "sampling_backend",
             "--load-format": "load_format", "--tp-size": "tensor_parallel_size", "--page-size": "block_size",
             "--max-running-requests": "max_running_requests",
             "--disable-radix-cache": "the arm's prefix_caching (false: --disable-radix-cache)"}
SKIP_TOKENIZER = ("--skip-tokenizer-init: SGLang 0.5.17 then answers prefixstudy's completions with HTTP 500 "
                  "(KeyError 'text') and min_tokens with 400; give it a tokenizer (engine.tokenizer_path: a folder "
                  "with a tokenizer.json)")


class SglangServerEngineConfig(EngineConfigBase):
    """How each arm's SGLang server is launched."""

    kind: Literal["sglang-server"] = Field(
        "sglang-server", description="SGLang's server launched per arm (RadixAttention on, or off with "
        "--disable-radix-cache), measured over HTTP.")
    max_model_len: int = Field(2048, gt=0, description="SGLang's `--context-length`: longest prompt + output, in "
                               "tokens; every dataset row is checked against it before a run.")
    block_size: int | None = Field(None, gt=0, description="SGLang's `--page-size`, the radix cache's unit in "
                                   "tokens; None: SGLang's default, 1.")
    model_path: str | None = Field(None, description="The server's `--model-path`; None: the study's `model`. "
                                   "With `load_format: dummy` a folder with the config.json is enough.")
    tokenizer_path: str | None = Field(None, description="A folder with the model's tokenizer.json "
                                       "(`--tokenizer-path`); None: the model's folder, which then needs one.")
    mem_fraction_static: float = Field(0.42, gt=0, lt=1, description="`--mem-fraction-static`: the share of the "
                                       "GPU memory free at the server's start that it keeps for weights and KV cache "
                                       "(its log's `KV Cache is allocated. #tokens` says what that left). One "
                                       "server at a time per GPU (`sweep.interleave_arms: false`).")
    attention_backend: str = Field("triton", description="`--attention-backend` (triton needs no kernel beyond "
                                   "SGLang's own wheel set).")
    sampling_backend: str = Field("pytorch", description="`--sampling-backend` (pytorch: no FlashInfer sampler).")
    load_format: str | None = Field("dummy", description="`--load-format`; dummy: random weights, nothing "
                                    "downloaded; None: SGLang's default (real weights).")
    max_running_requests: int | None = Field(None, gt=0, description="`--max-running-requests`: requests the "
                                             "server runs at once (the saturation check's limit); None: SGLang's.")
    server_args: list[str] = Field(default_factory=list, description="More SGLang server flags, as written on its "
                                   "command line (`--chunked-prefill-size 8192`).")
    host: str = Field("127.0.0.1", description="The address each server listens on.")
    port: int | None = Field(None, gt=0, lt=65536, description="The server's port; None: a free one per arm. A "
                             "fixed port serves one arm (`--modes`).")
    startup_timeout_s: float = Field(600.0, gt=0, description="Seconds to wait for a server's GET /health to "
                                     "answer 200 (CUDA graphs and Triton kernels are built at start).")

    @property
    def resident_share(self) -> float | None:
        # SGLang's static memory is mem_fraction_static of the memory free when the server starts
        # (its profile_max_num_token): a second server beside a first would get a smaller KV cache.
        return 1.0

    @property
    def admission_limit(self) -> int | None:
        return self.max_running_requests


def server_module() -> str:
    return os.environ.get(SERVER_MODULE_ENV) or SERVER_MODULE


def server_command(model: str, e: SglangServerEngineConfig, mode: str, port: int) -> list[str]:
    """The command line of one arm's server."""
    cmd = [sys.executable, "-m", server_module(), "--model-path", e.model_path or model, "--host", e.host,
           "--port", str(port), "--enable-cache-report", "--enable-metrics", "--context-length", str(e.max_model_len),
           "--mem-fraction-static", str(e.mem_fraction_static), "--attention-backend", e.attention_backend,
           "--sampling-backend", e.sampling_backend, "--tp-size", str(e.tensor_parallel_size)]
    for flag, value in (("--load-format", e.load_format), ("--tokenizer-path", e.tokenizer_path),
                        ("--page-size", e.block_size), ("--max-running-requests", e.max_running_requests)):
        if value is not None:
            cmd += [flag, str(value)]
    if not caching(e, mode):
        cmd.append("--disable-radix-cache")
    return cmd + list(e.server_args)


class SglangServerEngine(LaunchedServerEngine):
    """One arm's own SGLang server, measured through ``HttpEngine`` (``engines.launched``)."""

    kind = "sglang-server"
    server_name = "sglang"

    @classmethod
    def check_config(cls, model: str, engine: SglangServerEngineConfig, modes: list[str]) -> None:
        for arg in engine.server_args:
            flag = arg.split("=", 1)[0]
            if flag == "--skip-tokenizer-init":
                raise UserError(f"field 'engine.server_args': {SKIP_TOKENIZER}")
            if flag in OWN_FLAGS:
                raise UserError(f"field 'engine.server_args': {flag} is set by prefixstudy; set "
                                f"{OWN_FLAGS[flag]} instead")
        if engine.port is not None and len(modes) > 1:
            raise UserError(f"field 'engine.port': a fixed port serves one arm, and {len(modes)} run "
                            f"({', '.join(modes)}); leave it unset (a free port per arm) or run one arm with --modes")
        folder = engine.tokenizer_path or engine.model_path or model
        field = "engine.tokenizer_path" if engine.tokenizer_path else "engine.model_path" if engine.model_path \
            else "model"
        if (engine.tokenizer_path or Path(folder).is_dir()) and not (Path(folder) / "tokenizer.json").is_file():
            raise UserError(f"field '{field}': {folder} has no tokenizer.json, and SGLang needs the model's "
                            "tokenizer (without it, 0.5.17 refuses prefixstudy's requests); set "
                            "engine.tokenizer_path to a folder with one")
        if server_module() == SERVER_MODULE and not installed("sglang"):
            raise UserError("field 'engine.kind': sglang-server launches SGLang, which is not installed here "
                            "(pip install sglang; it needs a CUDA GPU)")

    @classmethod
    def versions(cls) -> dict[str, Any]:
        from importlib import metadata

        try:
            return {"sglang_version": metadata.version("sglang")}
        except metadata.PackageNotFoundError:
            return {"sglang_version": None}

    @classmethod
    def process_env(cls, engine: SglangServerEngineConfig, mode: str, use_gpu: bool) -> dict[str, str]:
        return {}

    def command(self, port: int) -> list[str]:
        return server_command(self.model, self.config, self.mode, port)

    def http_config(self, url: str) -> HttpEngineConfig:
        return HttpEngineConfig(server="sglang", targets={self.mode: url}, block_size=self.config.block_size,
                                max_model_len=self.config.max_model_len, max_num_seqs=self.config.max_running_requests,
                                health_timeout_s=self.config.startup_timeout_s)
