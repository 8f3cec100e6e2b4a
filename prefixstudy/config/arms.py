"""Arms: the engines a study compares, each an overlay on the study's ``engine`` section.

    sweep:
      modes: [on, off, on-bs64, on-offload]   # the arms to run; unset: on, off and every arm below
      baseline: off                            # every other arm is compared with this one
    arms:
      - name: on-bs64                          # prefix caching on (default), block size 64
        engine: {block_size: 64}
      - name: on-offload                       # and a 32 GiB CPU tier (vLLM's OffloadingConnector)
        offload: {size_gib: 32, backend: native}

``on`` and ``off`` are built in: the study's engine with prefix caching on / off.  Every arm
replays the same dataset on the same arrival schedule (the schedule's seed never sees the arm), and
its name is the ``mode`` of its results.  An overlay names fields of the study's backend
(``engine.kind`` is the study's, one for all arms); a nested mapping (``extra_args``) is merged
into the study's, not replaced.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from prefixstudy.engines.base import caching  # noqa: F401 - the arms' view of it

_STRICT = ConfigDict(extra="forbid")
NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"  # a mode: part of file names and request ids
# The engine arguments a CPU tier maps to, on the backends that take one (``cpu_tier`` in
# prefixstudy.engines.registry; vLLM's OffloadingConnector: ``kv_offloading_size`` in GiB,
# ``kv_offloading_backend``).
OFFLOAD_ARGS = ("kv_offloading_size", "kv_offloading_backend")
# The package each offload backend needs beyond vLLM (None: vLLM's own).
OFFLOAD_PACKAGES = {"native": None, "lmcache": "lmcache"}


class OffloadConfig(BaseModel):
    """A CPU tier under the GPU prefix cache."""

    model_config = _STRICT
    size_gib: float = Field(gt=0, description="The tier's size, GiB of host memory (vLLM's `kv_offloading_size`).")
    backend: Literal["native", "lmcache"] = Field("native", description="vLLM's `kv_offloading_backend`: `native` "
                                                  "(its OffloadingConnector); `lmcache` is refused (vLLM's "
                                                  "LMCacheMPConnector needs an LMCache server a study cannot "
                                                  "reset).")


class ArmConfig(BaseModel):
    model_config = _STRICT
    name: str = Field(pattern=NAME, description="The arm's name: the `mode` of its rows and part of file names "
                      "(not `on` or `off`).")
    prefix_caching: bool = Field(True, description="Prefix caching on this arm's engine.")
    engine: dict[str, Any] = Field(default_factory=dict, description="Fields of the study's `engine` section this "
                                   "arm overrides (`extra_args` is merged); empty: the study's engine.")
    offload: OffloadConfig | None = Field(None, description="A CPU tier under the prefix cache (vllm, vllm-server "
                                          "on a GPU); None: none.")


BUILTIN_ARMS = {"on": ArmConfig(name="on"), "off": ArmConfig(name="off", prefix_caching=False)}


def compared(arms: Sequence[str], baseline: str | None) -> tuple[str, str]:
    """The two arms headline.csv and the report's first screen compare: the first arm other than
    the baseline, and the baseline (``sweep.baseline``; off when it runs).  ON and OFF where there is
    no baseline or no other arm ran: their columns then hold what of them ran, with no gain."""
    other = [a for a in arms if a != baseline]
    return (other[0], baseline) if baseline is not None and other else ("on", "off")


def arm_label(arm: str) -> str:
    """An arm's name in text: ON / OFF for the built-in ones, a study's own as it named it."""
    return arm.upper() if arm in BUILTIN_ARMS else arm


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = {**out[k], **v} if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def overlay_data(engine, arm: ArmConfig) -> dict:
    """The arm's engine section as data: the study's, the arm's overlay merged in, its tier mapped
    to engine arguments."""
    data = _merge(engine.model_dump(exclude_unset=False), arm.engine)
    if arm.offload is not None:
        tier = {"kv_offloading_size": arm.offload.size_gib, "kv_offloading_backend": arm.offload.backend}
        data["extra_args"] = {**data.get("extra_args", {}), **tier}
    return data


def arm_engine(engine, arm: ArmConfig):
    """The engine config one arm's engine is built from (its caching set, ``engines.base.caching``)."""
    if not arm.engine and arm.offload is None:
        out = engine.model_copy(deep=True)
    else:
        out = type(engine).model_validate(overlay_data(engine, arm))
    out._prefix_caching = arm.prefix_caching
    return out
