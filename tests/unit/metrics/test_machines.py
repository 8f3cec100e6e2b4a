"""metrics.machines: a rate whose repeats ran on two machines is counted as two, with the spread
between the machines' means; and machine columns that contradict themselves are caught."""

from __future__ import annotations

import math

import pandas as pd

from prefixstudy.metrics.machines import machine_ids, machine_problems, machine_spread

A = {"host": "vm", "boot_id": "boot-a", "gpu_name": "NVIDIA H200", "gpu_uuid": "uuid-a"}
B = {"host": "vm", "boot_id": "boot-b", "gpu_name": "NVIDIA H200", "gpu_uuid": "uuid-b"}


def _summary(machines: dict[tuple[str, int], dict]) -> pd.DataFrame:
    return pd.DataFrame([{"mode": m, "rate": 10.0, "repeat": r, **mach} for (m, r), mach in machines.items()])


def _requests(e2e: dict[tuple[str, int], list[float]]) -> pd.DataFrame:
    return pd.DataFrame([{"mode": m, "rate": 10.0, "repeat": r, "e2e_ms": v}
                         for (m, r), vs in e2e.items() for v in vs])


def test_repeats_on_two_machines_count_two_and_give_the_spread_of_their_means():
    # ON: repeats 0 and 1 on machine A (mean of their requests 105 ms), repeat 2 on B (200 ms);
    # OFF: every repeat on A.
    summary = _summary({("on", 0): A, ("on", 1): A, ("on", 2): B, ("off", 0): A, ("off", 1): A, ("off", 2): A})
    req = _requests({("on", 0): [100, 100], ("on", 1): [110, 110], ("on", 2): [200, 200],
                     ("off", 0): [300], ("off", 1): [310], ("off", 2): [320]})
    got = machine_spread(req, summary, ("on", "off"))
    assert list(got) == ["on_machines", "off_machines", "on_machine_spread_pct", "off_machine_spread_pct"]
    assert (got["on_machines"], got["off_machines"]) == (2, 1)
    assert got["on_machine_spread_pct"] == (200 - 105) / ((200 + 105) / 2) * 100
    assert math.isnan(got["off_machine_spread_pct"])


def test_a_machine_is_its_host_boot_and_gpu():
    same_boot_other_gpu = {**A, "gpu_uuid": "uuid-c"}
    ids = machine_ids(_summary({("on", 0): A, ("on", 1): same_boot_other_gpu, ("on", 2): {**A, "host": "vm2"}}))
    assert ids.tolist() == ["vm/boot-a/uuid-a", "vm/boot-a/uuid-c", "vm2/boot-a/uuid-a"]
    # a summary written before the machine columns: one unknown machine
    old = pd.DataFrame({"mode": ["on", "on"], "rate": [10.0, 10.0], "repeat": [0, 1]})
    assert machine_spread(_requests({("on", 0): [1.0], ("on", 1): [2.0]}), old, ("on",))["on_machines"] == 1


def test_recorded_machines_that_hold_together_raise_nothing():
    cpu = {"host": "vm", "boot_id": "boot-c", "gpu_name": "", "gpu_uuid": ""}
    assert machine_problems(_summary({("on", 0): A, ("on", 1): B, ("off", 0): cpu, ("off", 1): A})) == []


def test_wrong_machine_columns_fail_the_check():
    """Repeats that claim one machine (host and boot) name one GPU UUID as two GPU kinds; another
    row names a UUID without its GPU; one boot id sits on two hosts."""
    wrong = _summary({("on", 0): A, ("on", 1): {**A, "gpu_name": "NVIDIA H100 80GB HBM3"},
                      ("off", 0): {**B, "gpu_name": ""}, ("off", 1): {**B, "host": "other", "gpu_uuid": "uuid-d"}})
    assert machine_problems(wrong) == ["GPU uuid-b has no name",
                                       "GPU uuid-a is named NVIDIA H100 80GB HBM3 and NVIDIA H200",
                                       "boot boot-b is on hosts other and vm"]
