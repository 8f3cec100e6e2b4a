"""The machine a point ran on, for a run whose points did not record it: what its manifest knows.

A run records its driver's machine at its start and at each ``--resume`` (the manifest's
``machines``), so a point ran on the latest entry recorded before it started.  Without entries the
run's own ``host`` and ``device`` are all there is.  Under Ray the engines ran on their actors'
nodes: the driver's entry counts only where the mode's engines report the driver's host, and
names no GPU UUID (the driver's GPU need not be theirs).  A simulated point ran on no machine.
"""

from __future__ import annotations

import datetime as dt

from prefixstudy.engines.registry import BACKENDS, capabilities
from prefixstudy.schema import MACHINE_COLUMNS

NONE = dict.fromkeys(MACHINE_COLUMNS, "")


def _epoch(stamp: str) -> float:
    try:
        return dt.datetime.fromisoformat(stamp).timestamp()
    except (TypeError, ValueError):
        return float("-inf")


def _gpu(device: str | None) -> str:
    """A manifest's ``device`` as a GPU name: "" for the CPU."""
    return "" if not device or device == "cpu" else str(device)


def recorded_machine(manifest: dict, point: dict) -> dict[str, str]:
    """summary.csv's machine columns (schema.MACHINE_FIELDS) of ``point`` (a manifest entry): its
    own where it recorded them, else what ``manifest`` knows (see the module docstring)."""
    if any(c in point for c in MACHINE_COLUMNS):
        return {c: str(point.get(c) or "") for c in MACHINE_COLUMNS}
    kind = manifest.get("engine")
    if isinstance(kind, str) and kind in BACKENDS and capabilities(kind).virtual_time:  # simulated: no machine
        return dict(NONE)
    entries = manifest.get("machines") or []
    started = point.get("started_at")
    before = [e for e in entries if started is None or _epoch(e.get("at")) <= float(started)]
    m = before[-1] if before else (entries[0] if entries else {})
    host = m.get("host") or manifest.get("host") or ""
    device = m.get("device") or manifest.get("device")
    out = {"host": host, "boot_id": m.get("boot_id") or "", "gpu_name": _gpu(device),
           "gpu_uuid": (m.get("device_uuid") or "") if _gpu(device) else ""}
    if manifest.get("executor") == "ray":
        engines = (manifest.get("engines") or {}).get(point.get("mode"), [])
        hosts = {e.get("host") for e in engines if e.get("host")}
        if hosts and hosts != {host}:  # the engines ran elsewhere: their host, the rest not known
            return {**NONE, "host": hosts.pop() if len(hosts) == 1 else "",
                    "gpu_name": _gpu(next((e.get("device") for e in engines if e.get("device")), ""))}
        out["gpu_name"] = _gpu(manifest.get("device"))  # the engines' device, from NVML on their node
        out["gpu_uuid"] = ""
    return out
