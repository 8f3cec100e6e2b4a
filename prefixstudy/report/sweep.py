"""A sweep's reports: each cell's own (``build_report``), then what reads the cells together,
picked by the sweep's axes: the capacity table and figure for a capacity axis, the routing
comparison for a sweep of routing policies alone, the gain against hit rate for a sweep of the
shared fraction alone.  Any other grid is read cell by cell."""

from __future__ import annotations

import json
from pathlib import Path

from prefixstudy.results.sweep_folder import CAPACITY, POLICY, SHARED, axis_values, read_index


def sweep_report(parent: Path, cells: bool = True) -> list[tuple[str, Path]]:
    """Writes the reports of the sweep at ``parent`` (its cells' too with ``cells``); returns
    (what, file) of each sweep-level report written."""
    from prefixstudy.report.build import build_report
    from prefixstudy.results.sweep_folder import cell_dirs

    parent = Path(parent)
    index = read_index(parent)
    if cells:
        for d in cell_dirs(parent):
            if json.loads((d / "manifest.json").read_text()).get("status") != "failed":
                build_report(d)  # a cell stopped before its points has nothing to report
    out: list[tuple[str, Path]] = []
    if axis_values(index, CAPACITY) is not None:
        from prefixstudy.report.capacity import write_capacity_report

        write_capacity_report(parent)
        out.append(("capacity", parent / "capacity.md"))
    if list(index["axes"]) == [SHARED]:
        from prefixstudy.report.hit_rate import hit_rate_report

        out.append(("hit rate", hit_rate_report(parent)))
    if list(index["axes"]) == [POLICY]:
        from prefixstudy.report.routing import routing_report

        out.append(("routing", routing_report(parent)))
    return out
