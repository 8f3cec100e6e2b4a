"""What each backend declares it can do (engines.registry), and the core's decisions that follow
the declaration rather than the backend's name."""

from __future__ import annotations

import ast
from dataclasses import fields, replace
from pathlib import Path

import pytest

from prefixstudy.sweep.capacity_axis import UNITS, capacity_config
from prefixstudy.config import load_config
from prefixstudy.engines import registry
from prefixstudy.engines.registry import BACKENDS, Capabilities, capabilities, kinds_that
from prefixstudy.errors import UserError
from prefixstudy.executors import base as executors
from prefixstudy.study.preflight import check_installed, check_plan

ECHO = {"engine": {"kind": "echo", "block_size": 16}, "executor": "local"}
# The one backend's own fields every kind's config needs to load.
REQUIRED = {"sim": {"calibration": "x"}, "http": {"targets": {"on": "http://127.0.0.1:9", "off": "http://127.0.0.1:9"}}}

EXPECTED = {
    "vllm": Capabilities(needs_vllm=True, replicas=True, cpu_tier=True,
                         capacity_units=("blocks", "bytes", "share", "offload_gib"), cache_salt=True,
                         shared_steps=True, gpu=True),
    "echo": Capabilities(replicas=True, capacity_units=("blocks", "tier_blocks"), local_by_default=True,
                         cache_salt=True),
    "http": Capabilities(local_by_default=True, cache_salt=True, shared_steps=True, remote=True),
    "vllm-server": Capabilities(needs_vllm=True, cpu_tier=True, capacity_units=("offload_gib",), gpus_in_process=True,
                                cache_salt=True, shared_steps=True, gpu=True),
    "sglang-server": Capabilities(gpus_in_process=True, shared_steps=True, gpu=True),
    "sim": Capabilities(virtual_time=True, needs_vllm=True, arm_overlays=False),
}


def test_each_backend_declares_exactly_this():
    assert {k: capabilities(k) for k in BACKENDS} == EXPECTED
    assert [f.name for f in fields(Capabilities)] == ["virtual_time", "needs_vllm", "replicas", "arm_overlays",
                                                     "cpu_tier", "capacity_units", "local_by_default",
                                                     "gpus_in_process", "cache_salt", "shared_steps", "gpu", "remote"]
    with pytest.raises(AttributeError):  # frozen: a declaration, not a setting
        capabilities("echo").replicas = False  # type: ignore[misc]


def test_the_declarations_agree_with_each_other():
    for kind, b in BACKENDS.items():
        can = b.can
        assert set(can.capacity_units) <= set(UNITS), kind
        assert ("offload_gib" in can.capacity_units) == can.cpu_tier, kind  # the tier unit is the CPU tier
        assert not (can.virtual_time and (can.replicas or can.arm_overlays)), kind  # the simulator has neither


def _load(kind: str, **sets):
    return load_config(None, {"engine": {"kind": kind, **REQUIRED.get(kind, {})}, "executor": "local", **sets})


@pytest.mark.parametrize("kind", list(BACKENDS))
def test_every_registered_kind_runs_or_is_refused_in_one_line(kind):
    """Each kind loads; a fleet of it is either planned or refused at config time, in one line
    naming the field (the simulator and the server backends run one engine per arm)."""
    cfg = _load(kind, replicas=2, **{"sweep.max_point_duration_s": 1e6})
    if capabilities(kind).replicas:
        check_plan(cfg)
    else:
        with pytest.raises(UserError, match=r"^field 'replicas': .*an in-process backend \(vllm, echo\)$"):
            check_plan(cfg)


def test_fleet_is_no_kind_and_is_refused_at_config_time_in_one_line():
    with pytest.raises(UserError) as e:
        load_config(None, {"engine.kind": "fleet"})
    assert str(e.value) == ("--set engine.kind: field 'engine.kind': 'fleet' is no backend (one of: vllm, echo, "
                            "http, vllm-server, sglang-server, sim); several engines of one behind a router are "
                            "`replicas` > 1")


def _declare(monkeypatch, kind: str, **can) -> None:
    b = BACKENDS[kind]
    monkeypatch.setitem(registry.BACKENDS, kind, replace(b, can=replace(b.can, **can)))


def test_replicas_follow_the_declaration(monkeypatch):
    cfg = load_config(None, {**ECHO, "replicas": 2})
    check_plan(cfg)
    _declare(monkeypatch, "echo", replicas=False)
    with pytest.raises(UserError, match=r"^field 'replicas': engine.kind echo measures the servers it is given; "
                                        r"replicas > 1 needs an in-process backend \(vllm\)$"):
        check_plan(cfg)


def test_cache_salt_follows_the_declaration_and_is_refused_in_one_line(monkeypatch):
    salt = {"sweep.cache_isolation": "salt"}
    check_plan(load_config(None, {**ECHO, **salt}))
    check_plan(_load("http", **salt))
    with pytest.raises(UserError) as e:
        check_plan(_load("sim", **salt))
    assert str(e.value) == ("field 'sweep.cache_isolation': engine.kind sim takes no per-request cache salt (salt "
                            "needs one of: vllm, echo, http, vllm-server)")
    with pytest.raises(UserError) as e:
        check_plan(_load("http", **salt, **{"engine.server": "sglang"}))
    assert str(e.value) == ("field 'sweep.cache_isolation': engine.server sglang takes no per-request cache salt "
                            "(vLLM's `cache_salt`); use reset")
    with pytest.raises(UserError) as e:
        check_plan(load_config(None, {**ECHO, **salt, "replicas": 2}))
    assert str(e.value) == ("field 'sweep.cache_isolation': a fleet (replicas > 1) resets each replica's own cache; "
                            "salt is for one engine or server, use reset")
    _declare(monkeypatch, "echo", cache_salt=False)
    with pytest.raises(UserError, match=r"^field 'sweep.cache_isolation': engine.kind echo takes no per-request "
                                        r"cache salt \(salt needs one of: vllm, http, vllm-server\)$"):
        check_plan(load_config(None, {**ECHO, **salt}))
    check_plan(load_config(None, ECHO))  # reset, the default, needs no salt


def test_the_default_executor_follows_the_declaration(monkeypatch):
    monkeypatch.setattr(executors, "ray_installed", lambda: True)
    assert executors.resolve_executor("auto", "echo") == "local"
    _declare(monkeypatch, "echo", local_by_default=False)
    assert executors.resolve_executor("auto", "echo") == "ray"


def test_capacity_units_follow_the_declaration(monkeypatch):
    cfg = load_config(None, ECHO)
    assert capacity_config(cfg, "blocks", 12).engine.num_blocks == 12
    _declare(monkeypatch, "echo", capacity_units=("tier_blocks",))
    with pytest.raises(UserError, match=r"^--capacity blocks: engine.kind echo has no cache size to set "
                                        r"\(blocks: vllm, bytes: vllm, share: vllm\)$"):
        capacity_config(cfg, "blocks", 12)


def test_a_cpu_tier_and_arm_overlays_follow_the_declaration(monkeypatch):
    tier = {**ECHO, "arms": [{"name": "t", "offload": {"size_gib": 1}}]}
    with pytest.raises(UserError, match=r"^--set arms: field 'arms.0.offload': engine.kind echo has no CPU tier "
                                        r"to set \(one of: vllm, vllm-server\)$"):
        load_config(None, tier)
    overlay = {**ECHO, "arms": [{"name": "b", "engine": {"block_size": 32}}]}
    load_config(None, overlay)
    _declare(monkeypatch, "echo", arm_overlays=False)
    with pytest.raises(UserError, match=r"^--set arms: field 'arms.0': engine.kind echo runs the study's engine "
                                        r"for every arm; an overlay needs a backend that starts one per arm "
                                        r"\(vllm, http, vllm-server, sglang-server\)$"):
        load_config(None, overlay)
    assert kinds_that("arm_overlays") == ["vllm", "http", "vllm-server", "sglang-server"]


def test_needing_vllm_follows_the_declaration(monkeypatch):
    monkeypatch.setattr("prefixstudy.study.preflight.installed", lambda name: name != "vllm")
    cfg = load_config(None, ECHO)
    check_installed(cfg)
    _declare(monkeypatch, "echo", needs_vllm=True)
    with pytest.raises(UserError, match=r"^field 'engine.kind': echo needs vLLM, which is not installed here"):
        check_installed(cfg)


def test_a_virtual_time_backend_is_handed_to_the_simulator(monkeypatch, tmp_path):
    """`prefixstudy run` of a sim config runs it in the simulator, never under the runner."""
    from prefixstudy.study import orchestrate as study

    seen = []
    monkeypatch.setattr(study, "_simulate", lambda cfg, run_dir: seen.append(cfg.engine.kind) or tmp_path)
    assert study.run_study(_load("sim")) == tmp_path and seen == ["sim"]
    _declare(monkeypatch, "echo", virtual_time=True)
    assert study.run_study(load_config(None, ECHO)) == tmp_path and seen == ["sim", "echo"]


PACKAGE = Path(__file__).resolve().parents[3] / "prefixstudy"
# Where a backend's own name may be compared: the backends themselves, and the flags that write
# one backend's config (--target-on/--target-off make an http study).
OWN_NAME = ("engines/", "sim/", "cli/run_flags.py")


def _literals(node: ast.AST) -> list[str]:
    items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return [x.value for x in items if isinstance(x, ast.Constant) and isinstance(x.value, str)]


def test_the_core_never_tests_a_backend_s_name():
    """A decision about what a backend can do asks its declaration: no comparison with a
    registered kind's name outside the backends (messages and schema defaults may name them)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.startswith(OWN_NAME):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                names = [s for side in (node.left, *node.comparators) for s in _literals(side) if s in BACKENDS]
                if names:
                    found.append(f"{rel}:{node.lineno}: {names}")
    assert found == []
