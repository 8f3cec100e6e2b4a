"""Every key of manifest.json is documented (prefixstudy.results.provenance: MANIFEST_KEYS, POINT_KEYS,
which the docs' results reference prints), with its JSON type: real runs on the echo backend, one of
each kind that adds keys (arms, a fleet, a resume, a merge, an engine that does not start, points
that fail before they run), and every manifest committed under experiments/ and benchmarks/ (the
Ray executor's and the simulator's keys, which cannot be made here).  A key only some runs have
must be marked optional; one that every run has must be in every manifest."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

from tests.scripts import load_script

from prefixstudy.config import load_config
from prefixstudy.engines.echo import EchoEngine
from prefixstudy.results.merge import merge_runs
from prefixstudy.results.provenance import MANIFEST_KEYS, POINT_KEYS
from prefixstudy.study.orchestrate import StudyFailed, run_study

# Six small studies on the echo backend: seconds, so the file runs in `make test`, not `make test-fast`.
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[3]
ECHO = {"engine": {"kind": "echo", "block_size": 16}, "executor": "local", "arrivals.process": "constant",
        "dataset.prefix_len": 32, "dataset.suffix_len": 4, "dataset.output_len": 3, "sweep.num_requests": 4,
        "sweep.warmup_requests": 1, "sweep.rates": [50]}
JSON = {"string": str, "number": (int, float), "integer": int, "boolean": bool, "object": dict, "array": list,
        "null": type(None)}
# Set by hand on a committed result, never by prefixstudy (experiments/results/README.md says why).
HAND_WRITTEN = {"status_note"}


def manifest(run: Path) -> dict:
    return json.loads((run / "manifest.json").read_text())


def undocumented(m: dict) -> tuple[set[str], set[str]]:
    return set(m) - set(MANIFEST_KEYS), {k for p in m["points"] for k in p} - set(POINT_KEYS)


def check(m: dict) -> None:
    """Only documented keys, every required one, each value of its documented JSON type."""
    assert undocumented(m) == (set(), set())
    for keys, entry in [(MANIFEST_KEYS, m), *((POINT_KEYS, p) for p in m["points"])]:
        assert {k for k, key in keys.items() if not key.optional} <= set(entry)
        for k, v in entry.items():
            types = tuple(JSON[t.strip()] for t in keys[k].type.split("|"))
            assert isinstance(v, types) and (bool in types or not isinstance(v, bool)), (k, v)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("res")

    def run(sets: dict, name: str) -> Path:
        return run_study(load_config(None, {**ECHO, **sets, "out": str(out)}), run_dir=out / name, progress=False)

    got = {"arms": run({"arms": [{"name": "on-bs32", "engine": {"block_size": 32}}]}, "arms"),
           "fleet": run({"replicas": 2, "router.policies": ["round_robin"]}, "fleet")}
    got["resumed"] = run({}, "resumed")
    run_study(None, progress=False, resume=got["resumed"])
    got["merged"] = merge_runs([run({"sweep.modes": ["on"]}, "on"), run({"sweep.modes": ["off"]}, "off")], out,
                               run_dir=out / "merged")
    return got


@pytest.mark.parametrize("kind", ["arms", "fleet", "resumed", "merged"])
def test_a_run_writes_only_documented_keys_of_their_types(runs, kind):
    m = manifest(runs[kind])
    check(m)
    assert m["status"] == "complete" and "error" not in m
    assert {"config_sha256", "step_fit", "step_timing", "step_checks", "step_timing_methods"} <= set(m)
    assert len(m["points"]) == {"arms": 3, "fleet": 2, "resumed": 2, "merged": 2}[kind]
    # What each kind of run adds, beyond a plain one:
    assert ("resumed_at" in m, "merged_from" in m) == (kind == "resumed", kind == "merged")
    # Where it ran: once at the start, again at each resume; this machine's boot, no GPU here.
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert [(x["boot_id"], x["device"], x["device_uuid"]) for x in m["machines"]] == \
        [(boot, "cpu", "")] * (2 if kind == "resumed" else 1)
    assert all(("router" in p, "replicas" in p) == (kind == "fleet",) * 2 for p in m["points"])
    assert [p["prefix_caching"] for p in m["points"]] == {"arms": [True, False, True]}.get(kind, [True, False])


def test_an_engine_that_does_not_start_leaves_its_error_and_log(tmp_path, monkeypatch):
    class NoStart(RuntimeError):
        log = "the engine's own last words\n"

    async def start(self):
        raise NoStart("no start")

    monkeypatch.setattr(EchoEngine, "start", start)
    with pytest.raises(StudyFailed) as e:
        run_study(load_config(None, {**ECHO, "out": str(tmp_path)}), run_dir=tmp_path / "run", progress=False)
    m = manifest(e.value.run_dir)
    check(m)
    assert (m["status"], m["points"], m["error_log"]) == ("failed", [], "engine-start.log")
    assert m["error"].startswith("cache ON: the engine did not start (NoStart: no start")
    assert (e.value.run_dir / m["error_log"]).read_text() == NoStart.log


def test_a_point_that_fails_before_it_runs_has_the_required_keys_only(tmp_path, monkeypatch):
    async def reset_prefix_cache(self):
        raise RuntimeError("no reset")

    monkeypatch.setattr(EchoEngine, "reset_prefix_cache", reset_prefix_cache)
    run = run_study(load_config(None, {**ECHO, "out": str(tmp_path)}), run_dir=tmp_path / "run", progress=False)
    m = manifest(run)
    check(m)
    assert m["status"] == "complete_with_failures"
    required = [k for k, key in POINT_KEYS.items() if not key.optional]
    for p in m["points"]:
        assert sorted(p) == sorted(required)
        assert (p["status"], p["error"]) == ("failed", "RuntimeError: no reset")


@pytest.mark.parametrize("path", sorted(p.relative_to(REPO).as_posix() for d in ("experiments", "benchmarks")
                                        for p in (REPO / d).rglob("manifest.json")))
def test_committed_manifests_hold_only_documented_keys(path):
    m = json.loads((REPO / path).read_text())
    top, point = undocumented(m)
    assert (top - HAND_WRITTEN, point) == (set(), set())


def test_the_results_page_lists_every_key_once():
    hook = load_script("docs/hooks/reference.py")
    page = hook.results_page().split("## `manifest.json`", 1)[1]
    top, points = page.split("### A point's keys", 1)
    for section, keys in ((top, MANIFEST_KEYS), (points, POINT_KEYS)):
        rows = [re.split(r"(?<!\\)\|", line) for line in section.splitlines() if line.startswith("| `")]
        assert [r[1].strip(" `") for r in rows] == list(keys)
        assert [r[3].strip() for r in rows] == ["no" if k.optional else "yes" for k in keys.values()]
