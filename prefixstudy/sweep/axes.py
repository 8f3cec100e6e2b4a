"""The engine axes of a grid.  Each says what one of its values does to the config (``apply``),
the name of the cell folder it contributes (``folder``) and what it records beside a cell's run
(``record``); a new axis is one class here.

- ``capacity.<unit>``: the KV cache's size, or the CPU tier's (``prefixstudy.sweep.capacity_axis``).
- ``router.policy``: a fleet's routing policy (``replicas`` > 1), one run per policy
  (``routing_sweep.policy_config``).
- any other dotted config field (``engine.max_num_batched_tokens``, ``dataset.shared_fraction``):
  the field set to the value, the whole config validated again.

Why each engine value is its own run folder: it needs its own engine start anyway, and a run per
cell keeps everything keyed on (arm, rate, repeat) as it is: store parts, resume, merge, report.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prefixstudy.config import StudyConfig, parse_config, set_dotted
from prefixstudy.errors import UserError
from prefixstudy.results.sweep_folder import CAPACITY, POLICY


@dataclass(frozen=True)
class FieldAxis:
    """Any config field: ``name`` is its dotted path."""

    name: str
    values: tuple

    def apply(self, cfg: StudyConfig, value: Any) -> StudyConfig | None:
        data = cfg.model_dump(mode="json")
        node = data
        for part in self.name.split(".")[:-1]:
            node = node.get(part) if isinstance(node, dict) else None
            if not isinstance(node, dict):
                raise UserError(f"field 'grid.{self.name}': '{part}' is not a config section")
        set_dotted(data, self.name, value)
        return parse_config(data, f"field 'grid.{self.name}' = {value!r}")

    def folder(self, value: Any) -> str:
        return f"{self.name.rsplit('.', 1)[-1]}-{_text(value)}"

    def record(self, cfg: StudyConfig, rows, run_dir: Path) -> dict:
        return {}


@dataclass(frozen=True)
class CapacityAxis:
    """The KV cache's size (or the CPU tier's) in ``unit`` (``capacity.UNITS``)."""

    unit: str
    values: tuple

    @property
    def name(self) -> str:
        return f"{CAPACITY}{self.unit}"

    def apply(self, cfg: StudyConfig, value: float) -> StudyConfig | None:
        from prefixstudy.sweep.capacity_axis import capacity_config

        return capacity_config(cfg, self.unit, float(value))

    def folder(self, value: float) -> str:
        return f"{self.unit}-{float(value):g}"

    def record(self, cfg: StudyConfig, rows, run_dir: Path) -> dict:
        """The dataset's working set and reuse footprint in the blocks the run's engine used."""
        import json

        from prefixstudy.sweep.capacity_axis import reuse_footprint_blocks, working_set_blocks
        from prefixstudy.workloads.base import group_prefixes

        try:
            points = json.loads((run_dir / "manifest.json").read_text()).get("points", [])
        except (OSError, ValueError):
            points = []
        block = next((p["block_size"] for p in points if p.get("block_size")), 0)
        if not block:
            return {"working_set_blocks": None, "reuse_footprint_blocks": None}
        primes = [p for _, p in sorted(group_prefixes(rows).items()) if p] if cfg.sweep.prime_prefixes else []
        return {"working_set_blocks": working_set_blocks(rows, block),
                "reuse_footprint_blocks": reuse_footprint_blocks(rows, block, primes)}


@dataclass(frozen=True)
class PolicyAxis:
    """A fleet's routing policy; an arm without caching runs only under ``router.off_policies``."""

    values: tuple
    name: str = POLICY

    def apply(self, cfg: StudyConfig, value: str) -> StudyConfig | None:
        from prefixstudy.sweep.routing_axis import policy_config

        return policy_config(cfg, value)

    def folder(self, value: str) -> str:
        return f"policy-{value}"

    def record(self, cfg: StudyConfig, rows, run_dir: Path) -> dict:
        return {}


Axis = FieldAxis | CapacityAxis | PolicyAxis


def grid_axes(cfg: StudyConfig) -> list[Axis]:
    """The engine axes of ``cfg``: its ``grid`` in the order written, then, for a fleet
    (``replicas`` > 1), its routing policies: one run each where several are given, or where
    the fleet is the grid's only axis (its one policy then still gets a run of its own, so that
    the sweep's routing report reads any fleet the same way)."""
    from prefixstudy.sweep.capacity_axis import UNITS, parse_capacity

    out: list[Axis] = []
    for name, values in cfg.grid.items():
        if name.startswith(CAPACITY):
            unit = name[len(CAPACITY):]
            if unit not in UNITS:
                raise UserError(f"field 'grid.{name}': no capacity unit {unit!r} (one of {', '.join(UNITS)})")
            try:
                _, parsed = parse_capacity(f"{unit}={','.join(str(v) for v in values)}")
            except UserError as e:
                raise UserError(f"field 'grid.{name}': {str(e).partition(': ')[2]}") from None
            out.append(CapacityAxis(unit, tuple(parsed)))
        elif name in (POLICY, "router.policies"):
            raise UserError(f"field 'grid.{name}': routing policies are swept by router.policies (with replicas > 1)")
        else:
            out.append(FieldAxis(name, tuple(values)))
    if cfg.replicas > 1 and (len(cfg.router.policies) > 1 or not out):
        out.append(PolicyAxis(tuple(cfg.router.policies)))
    return out


def _text(value: Any) -> str:
    if isinstance(value, float) and math.isfinite(value):
        return f"{value:g}"
    return str(value).replace("/", "_")
