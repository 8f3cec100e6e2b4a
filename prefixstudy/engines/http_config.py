"""Backend ``http``: its config (``HttpEngineConfig``: one base URL per arm) and what differs
between the servers it measures (``PROFILES``, chosen by ``engine.server``).  The engine itself
is ``engines.http``."""

from __future__ import annotations

from typing import Any, Literal, NamedTuple

from pydantic import Field, field_validator, model_validator

from prefixstudy.engines.base import EngineConfigBase


class ServerProfile(NamedTuple):
    """What differs between the servers the http backend measures (``engine.server``)."""

    reset_path: str  # POST here resets the prefix cache
    reset_busy_status: int | None  # the reset's answer while requests run (None: a success flag in the body)
    block_size: int | None  # the prefix cache's unit when the server does not report it (None: http.DEFAULT_BLOCK_SIZE, warned)
    cached_tokens_flag: str  # what makes it report usage.prompt_tokens_details.cached_tokens
    reset_flag: str  # what makes it expose the reset endpoint
    # Fields added to every completion request.  vLLM's return_token_ids puts each event's token ids
    # in the stream, so tokens it sends several to an event (a loaded server) are counted where they
    # arrived, not taken from usage at the end.
    payload: dict[str, Any] = {}
    cache_salt: bool = False  # takes vLLM's per-request `cache_salt` field (sweep.cache_isolation salt)
    # It leaves usage.prompt_tokens_details null when nothing was cached (SGLang: "keeps JSON slim"), so
    # a null is 0 cached tokens; whether the server reports them at all is then read from its counters.
    null_when_uncached: bool = False


# SGLang's, from its sources (0.5.17's ran on an H200 through the sglang-server backend): /flush_cache
# answers 400 while requests run; its radix cache matches single tokens (page size 1) unless
# --page-size says otherwise.
PROFILES = {
    # reset_external: the KV connector's cache too (a CPU tier), else a point starts on the last one's.
    "vllm": ServerProfile("/reset_prefix_cache?reset_external=true", None, None, "--enable-prompt-tokens-details",
                          "VLLM_SERVER_DEV_MODE=1", {"return_token_ids": True}, cache_salt=True),
    "sglang": ServerProfile("/flush_cache", 400, 1, "--enable-cache-report", "a release with /flush_cache",
                            null_when_uncached=True),
}


class HttpEngineConfig(EngineConfigBase):
    """A running server per mode.  ``block_size``: the server's prefix-cache block (for the
    expected cached tokens); unset, it is read from vLLM's /metrics."""

    kind: Literal["http"] = Field("http", description="Running OpenAI-compatible servers, one base URL per arm.")
    targets: dict[str, str] = Field(default_factory=dict, description="Arm name (on, off, ...) -> the base URL of "
                                    "its server (`--target-on` / `--target-off`).")
    served_model: str | None = Field(None, description="The requests' `model`; None: the first of the server's "
                                     "/v1/models.")
    server: Literal["vllm", "sglang"] = Field("vllm", description="The server's API (engines.http_config.PROFILES): how "
                                              "its cache is reset, reports cached tokens and counts them.")
    reset_path: str | None = Field(None, description="POST here resets the prefix cache; None: the server's "
                                   "(vllm: /reset_prefix_cache, sglang: /flush_cache).")
    reset_timeout_s: float = Field(60.0, gt=0, description="Seconds a reset keeps asking while the previous "
                                   "point's requests finish.")
    metrics_path: str | None = Field("/metrics", description="Prometheus text scraped before and after each "
                                     "point (the `server_*` summary columns); None: not scraped.")
    health_timeout_s: float = Field(60.0, gt=0, description="Seconds to wait at start for GET /health to "
                                    "answer.")
    max_num_seqs: int | None = Field(None, gt=0, description="The server's own `max_num_seqs` (SGLang: "
                                     "`max_running_requests`), when known: with it a point is saturated once the "
                                     "server ran full; None: a trend test on the requests in flight decides "
                                     "(weaker, docs/saturation.md).")

    @property
    def admission_limit(self) -> int | None:
        return self.max_num_seqs

    def salt_refusal(self) -> str:
        if PROFILES[self.server].cache_salt:
            return ""
        return f"engine.server {self.server} takes no per-request cache salt (vLLM's `cache_salt`); use reset"

    @field_validator("targets", mode="before")
    @classmethod
    def _yaml_on_off(cls, v):
        # YAML 1.1 reads a bare `on:` / `off:` key as true / false; the user meant the mode.
        if isinstance(v, dict):
            return {({True: "on", False: "off"}.get(k, k) if isinstance(k, bool) else k): u for k, u in v.items()}
        return v

    @model_validator(mode="after")
    def _profile_reset_path(self) -> "HttpEngineConfig":
        if self.reset_path is None:
            self.reset_path = PROFILES[self.server].reset_path
        return self

    @field_validator("targets")
    @classmethod
    def _urls(cls, v: dict[str, str]) -> dict[str, str]:
        from urllib.parse import urlsplit

        for mode, url in v.items():
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"{mode}: {url!r} is not an http:// or https:// base URL")
            try:
                parts = urlsplit(url)
                parts.port  # noqa: B018 (a port that is no number raises here)
            except ValueError:
                raise ValueError(f"{mode}: {url!r} has no valid host and port") from None
            if not parts.hostname:
                raise ValueError(f"{mode}: {url!r} has no host")
        return {m: u.rstrip("/") for m, u in v.items()}
