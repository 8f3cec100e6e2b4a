"""Each point records the machine its engine ran on (summary.csv's host, boot_id, gpu_name,
gpu_uuid): an echo engine in process names this host and no GPU; an older run's points get what
its manifest knows (results.machines)."""

from __future__ import annotations

import socket
import sys
import types

import pandas as pd
import pytest

from prefixstudy.config import load_config
from prefixstudy.results import load
from prefixstudy.results.machines import recorded_machine
from prefixstudy.shared import machine
from prefixstudy.study.orchestrate import run_study

ECHO = {"engine": {"kind": "echo", "block_size": 16, "decode_ms_per_token": 0.2}, "executor": "local",
        "arrivals.process": "constant", "dataset.prefix_len": 32, "dataset.suffix_len": 8, "dataset.output_len": 2,
        "sweep.num_requests": 4, "sweep.warmup_requests": 0, "sweep.rates": [50], "sweep.repeats": 2}


def test_an_echo_engine_in_process_records_this_host_and_no_gpu(tmp_path):
    run = load(run_study(load_config(None, {**ECHO, "out": str(tmp_path)}), progress=False))
    boot = open("/proc/sys/kernel/random/boot_id").read().strip()
    assert len(run.summary) == 4 and boot
    cols = run.summary[["host", "boot_id", "gpu_name", "gpu_uuid"]]
    assert cols.drop_duplicates().values.tolist() == [[socket.gethostname(), boot, "", ""]]
    assert run.headline[["on_machines", "off_machines"]].values.tolist() == [[1, 1]]
    assert [(p["host"], p["gpu_uuid"]) for p in run.manifest["points"]] == [(socket.gethostname(), "")] * 4


H200 = {"host": "vm", "device": "NVIDIA H200", "device_uuid": ""}
OLD = {"executor": "local", "host": "vm", "device": "NVIDIA H200",
       "machines": [{"at": "2026-12-03T19:20:56+00:00", "boot_id": "b1", **H200},
                    {"at": "2026-12-03T19:32:45+00:00", "boot_id": "b2", **H200, "device_uuid": "u2"}]}


def test_an_older_point_ran_on_the_machine_recorded_last_before_it_started():
    start2 = pd.Timestamp("2026-12-03T19:32:45+00:00").timestamp()
    assert recorded_machine(OLD, {"mode": "on", "started_at": start2 - 1}) == \
        {"host": "vm", "boot_id": "b1", "gpu_name": "NVIDIA H200", "gpu_uuid": ""}
    assert recorded_machine(OLD, {"mode": "on", "started_at": start2 + 1}) == \
        {"host": "vm", "boot_id": "b2", "gpu_name": "NVIDIA H200", "gpu_uuid": "u2"}
    # a point that recorded its machine keeps it; a run without `machines` is its host and device
    own = {"host": "h", "boot_id": "b", "gpu_name": "", "gpu_uuid": ""}
    assert recorded_machine(OLD, {"mode": "on", "started_at": 0, **own}) == own
    assert recorded_machine({"executor": "local", "host": "vm", "device": "cpu"}, {"mode": "on"}) == \
        {"host": "vm", "boot_id": "", "gpu_name": "", "gpu_uuid": ""}


def test_ray_engines_elsewhere_and_simulated_points_name_no_driver_machine():
    ray = {**OLD, "executor": "ray", "engines": {"on": [{"host": "node7", "device": "NVIDIA H100 80GB HBM3"}],
                                                 "off": [{"host": "vm", "device": "NVIDIA H200"}]}}
    assert recorded_machine(ray, {"mode": "on", "started_at": 0}) == \
        {"host": "node7", "boot_id": "", "gpu_name": "NVIDIA H100 80GB HBM3", "gpu_uuid": ""}
    assert recorded_machine(ray, {"mode": "off", "started_at": 0}) == \
        {"host": "vm", "boot_id": "b1", "gpu_name": "NVIDIA H200", "gpu_uuid": ""}
    assert set(recorded_machine({"executor": "sim", "engine": "sim", "host": "vm"}, {"mode": "on"}).values()) == {""}


class _Nvml(types.SimpleNamespace):
    """NVML's calls as pynvml spells them, over two GPUs (no driver here to ask)."""

    def __init__(self):
        gpus = [("NVIDIA H200", "GPU-aaa"), ("NVIDIA H100 80GB HBM3", "GPU-bbb")]
        super().__init__(nvmlInit=lambda: None, nvmlDeviceGetHandleByIndex=lambda i: gpus[i],
                         nvmlDeviceGetHandleByUUID=lambda u: next(g for g in gpus if g[1] == u),
                         nvmlDeviceGetName=lambda h: h[0], nvmlDeviceGetUUID=lambda h: h[1].encode())


@pytest.mark.parametrize(("visible", "exact", "want"), [
    (None, True, ("NVIDIA H200", "aaa")), ("1,0", True, ("NVIDIA H100 80GB HBM3", "bbb")),
    ("GPU-bbb", True, ("NVIDIA H100 80GB HBM3", "bbb")), ("", True, ("", "")), ("GPU-zzz", True, ("", "")),
    ("", False, ("NVIDIA H200", ""))])
def test_the_process_gpu_is_the_first_it_may_use(monkeypatch, visible, exact, want):
    monkeypatch.setitem(sys.modules, "pynvml", _Nvml())
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert machine.process_gpu(exact) == want
