"""The wheel a user installs, built from the checkout and installed in a fresh venv outside the
repo, for tests/packaging/test_wheel.py (the test venv's packages beside it) and
tests/unit/cli/test_missing_packages.py (only the base dependencies).  Nothing is downloaded: the
wheel goes in with --no-deps, and its dependencies are folders a .pth file names."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[1]
# What the wheel is built from (pyproject.toml's package data and license-files name the rest).
SOURCES = ("pyproject.toml", "README.md", "LICENSE", "prefixstudy")


def sh(*args, cwd: Path | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    r = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"{args}: exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


def wheel_venv(tmp: Path, deps: list[str | Path]) -> SimpleNamespace:
    """Build the wheel from a copy of the sources (the shared tree gets no build/) and install it in
    tmp/venv, whose sys.path then ends with ``deps``.  Returns the venv, its python, the wheel, a
    clean environment and a folder outside the repo to run from."""
    src = tmp / "src"
    src.mkdir()
    for name in SOURCES:
        p = REPO / name
        if p.is_dir():
            shutil.copytree(p, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy(p, src / name)
    dist = tmp / "dist"
    sh(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", dist, src, cwd=tmp)
    (wheel,) = dist.glob("prefixstudy-*.whl")
    venv = tmp / "venv"
    sh(sys.executable, "-m", "venv", "--without-pip", venv, cwd=tmp)
    py = venv / "bin" / "python"
    sh(sys.executable, "-m", "pip", "--python", py, "install", "--no-deps", "--no-index", "-q", wheel, cwd=tmp)
    # A .pth line is a plain sys.path entry, after the venv's own: the folders' own .pth files
    # (the test venv's editable prefixstudy) stay unread.
    site = Path(sh(py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=tmp).stdout.strip())
    (site / "zz_deps.pth").write_text("".join(f"{d}\n" for d in deps))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    cwd = tmp / "elsewhere"  # not the checkout, which `python -m` would put first on sys.path
    cwd.mkdir()
    return SimpleNamespace(venv=venv, py=py, wheel=wheel, env=env, cwd=cwd)
