"""No module of the package is over 600 lines: a longer one is split into modules named for what
they hold.  Over 400 lines a module draws a warning, not a failure, so that no stage is cut in two
only to pass a count.  Lines are counted as ``wc -l`` counts them (newline characters)."""

from __future__ import annotations

import warnings
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "prefixstudy"
MAX_LINES = 600
WARN_LINES = 400


def line_count(path: Path) -> int:
    """What ``wc -l`` prints for the file: its number of newline bytes."""
    return path.read_bytes().count(b"\n")


def over(sizes: dict[str, int], limit: int) -> list[str]:
    return [f"{name} ({n} lines)" for name, n in sizes.items() if n > limit]


def test_no_module_is_over_600_lines():
    sizes = {p.relative_to(PACKAGE.parent).as_posix(): line_count(p) for p in sorted(PACKAGE.rglob("*.py"))}
    assert len(sizes) > 100
    assert over(sizes, MAX_LINES) == [], f"over {MAX_LINES} lines: " + ", ".join(over(sizes, MAX_LINES))
    if long := over(sizes, WARN_LINES):
        warnings.warn(f"over {WARN_LINES} lines (split where a part has a name of its own): " + ", ".join(long),
                      stacklevel=1)


def test_a_module_between_the_two_limits_warns_and_one_over_fails():
    sizes = {"a.py": 400, "b.py": 401, "c.py": 600, "d.py": 601}
    assert over(sizes, WARN_LINES) == ["b.py (401 lines)", "c.py (600 lines)", "d.py (601 lines)"]
    assert over(sizes, MAX_LINES) == ["d.py (601 lines)"]


def test_lines_are_counted_as_wc_counts_them(tmp_path):
    f = tmp_path / "m.py"
    f.write_bytes(b"a\nb\n\nc")  # wc -l: 3 (the last line has no newline)
    assert line_count(f) == 3
