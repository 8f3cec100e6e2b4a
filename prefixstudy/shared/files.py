"""Atomic writes: every file is written to a temp file in its folder and renamed over its name,
so a reader (or a killed process) never sees half a file.  Files follow the umask, like any other
tool's output.  The results store (``results.store``) and the dataset writers use them."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def _file_mode() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def _temp_beside(path: Path) -> tuple[int, str]:
    """A temp file next to ``path`` (same filesystem, so the rename is atomic), with the mode a
    plain ``open()`` would give: mkstemp's 0600 would make every result private by accident."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.fchmod(fd, _file_mode())
    return fd, tmp


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write to a temp file in the same folder, fsync, then rename over ``path``."""
    fd, tmp = _temp_beside(path)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))
