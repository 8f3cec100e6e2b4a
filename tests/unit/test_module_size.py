"""No module of the package is over 400 lines: a longer one is split into modules named for what
they hold.  Lines are counted as ``wc -l`` counts them (newline characters)."""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "prefixstudy"
MAX_LINES = 400


def line_count(path: Path) -> int:
    """What ``wc -l`` prints for the file: its number of newline bytes."""
    return path.read_bytes().count(b"\n")


def test_no_module_is_over_400_lines():
    sizes = {p.relative_to(PACKAGE.parent).as_posix(): line_count(p) for p in sorted(PACKAGE.rglob("*.py"))}
    assert len(sizes) > 100
    over = [f"{name} ({n} lines)" for name, n in sizes.items() if n > MAX_LINES]
    assert over == [], f"over {MAX_LINES} lines: " + ", ".join(over)


def test_lines_are_counted_as_wc_counts_them(tmp_path):
    f = tmp_path / "m.py"
    f.write_bytes(b"a\nb\n\nc")  # wc -l: 3 (the last line has no newline)
    assert line_count(f) == 3
