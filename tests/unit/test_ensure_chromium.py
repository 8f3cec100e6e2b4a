"""make test's chromium prerequisite (tools/ensure-chromium.sh), with the real browser hidden: PATH
holds only stand-ins for ``id`` (root or not) and ``apt-get`` (records each call, and on install puts
a ``chromium`` on PATH as Debian's package does)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from tests.scripts import REPO

SCRIPT = REPO / "tools" / "ensure-chromium.sh"
BASH = shutil.which("bash")


def _stub(path: Path, body: str) -> None:
    path.write_text("#!" + BASH + "\n" + body)
    path.chmod(0o755)


def _run(tmp_path: Path, uid: int, apt_ok: bool = True, browser: bool = False) -> tuple[subprocess.CompletedProcess,
                                                                                        list[str]]:
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    calls = tmp_path / "apt-calls"
    for tool in ("mktemp", "rm"):
        os.symlink(shutil.which(tool), bin_ / tool)
    _stub(bin_ / "id", f'[ "$1" = -u ] && echo {uid}\n')
    install = f'printf "#!{BASH}\\n" > "{bin_}/chromium"; {shutil.which("chmod")} +x "{bin_}/chromium"' if apt_ok else "exit 100"
    _stub(bin_ / "apt-get", f'echo "DEBIAN_FRONTEND=${{DEBIAN_FRONTEND:-}} $*" >> "{calls}"\n'
                            f'case "$1" in install) {install} ;; esac\n')
    if browser:
        _stub(bin_ / "chromium-browser", "")
    return _call(tmp_path)


def _call(tmp_path: Path) -> tuple[subprocess.CompletedProcess, list[str]]:
    """The script with PATH = the stand-ins only; what it printed and apt-get's recorded calls."""
    res = subprocess.run([BASH, str(SCRIPT)], env={"PATH": str(tmp_path / "bin"), "TMPDIR": str(tmp_path)},
                         capture_output=True, text=True, timeout=30)
    calls = tmp_path / "apt-calls"
    return res, calls.read_text().splitlines() if calls.exists() else []


def test_a_browser_on_path_needs_nothing(tmp_path):
    res, calls = _run(tmp_path, uid=0, browser=True)
    assert (res.returncode, res.stderr, calls) == (0, "", [])


def test_as_root_it_asks_apt_get_for_chromium_quietly_and_goes_on(tmp_path):
    res, calls = _run(tmp_path, uid=0)
    assert res.returncode == 0
    assert calls == ["DEBIAN_FRONTEND= update -qq",
                     "DEBIAN_FRONTEND=noninteractive install -y -qq --no-install-recommends chromium"]
    assert res.stderr == "make test: installing chromium (apt-get, once; the HTML report test renders in it)\n"
    assert res.stdout == ""
    again, calls_after = _call(tmp_path)
    assert (again.returncode, again.stderr, calls_after) == (0, "", calls)  # once: found on the next call


def test_not_root_it_stops_at_once_with_the_one_command(tmp_path):
    res, calls = _run(tmp_path, uid=1000)
    assert (res.returncode, calls) == (1, [])
    assert res.stderr == "make test needs chromium (the HTML report test renders in it): sudo apt-get install chromium\n"


def test_a_failed_install_says_so_in_one_line_and_keeps_apt_gets_log(tmp_path):
    res, calls = _run(tmp_path, uid=0, apt_ok=False)
    assert res.returncode == 1 and len(calls) == 2
    lines = res.stderr.splitlines()
    assert len(lines) == 2 and lines[0].startswith("make test: installing chromium")
    assert lines[1].startswith("make test: apt-get could not install chromium (its log: " + str(tmp_path))
    assert not list((tmp_path / "bin").glob("chromium"))


def test_make_test_runs_the_prerequisite_first_and_ci_installs_then_runs_the_readme_test_command():
    make = (REPO / "Makefile").read_text()
    assert "\ntest: chromium lint docs\n" in make
    assert "chromium:\n\t@bash tools/ensure-chromium.sh\n" in make
    ci = [ln for ln in (REPO / ".ci" / "run").read_text().splitlines() if ln and not ln.startswith("#")]
    assert ci == ["set -euo pipefail", 'cd "$(dirname "$0")/.."', "make install", "make test"]
