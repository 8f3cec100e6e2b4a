"""Stage: engines.  Who answers the requests: the protocol (``engines.base``), the registry of
backends and what each can do (``engines.registry``), and ``runner.engine_build.make_engine``, which
builds the engine one arm of a study runs.

Backends are imported when asked for, so a study on one backend never imports another's
dependencies (vLLM is imported by ``engines.vllm`` alone, and only once an engine starts)."""

from __future__ import annotations

from prefixstudy.engines.base import Engine, IterationSample, RequestTrace
from prefixstudy.engines.registry import BACKENDS, Capabilities, capabilities, config_classes, engine_class

__all__ = ["BACKENDS", "Capabilities", "Engine", "IterationSample", "RequestTrace", "capabilities", "config_classes",
           "engine_class"]
