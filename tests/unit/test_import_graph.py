"""The package's modules import each other without a circle.

Read from the source with ``ast``, not by importing: every import of a ``prefixstudy`` module
counts, at the top of a module, inside a function and under ``if TYPE_CHECKING`` alike (a lazy or
type-only import still says that one module needs the other), and so does a package's
``__init__`` importing its own submodules.  ``from pkg import name`` is an edge to ``pkg.name``
where that is a module, else to ``pkg``.  Importing ``pkg.mod`` runs ``pkg/__init__.py`` first,
so it is an edge to ``pkg`` as well (unless the importer is inside ``pkg``, which Python has
already begun)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "prefixstudy"


def modules(root: Path, package: str) -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (its file, whether it is a package's ``__init__``)."""
    out = {}
    for f in sorted(root.rglob("*.py")):
        parts = [package, *f.relative_to(root).with_suffix("").parts]
        is_pkg = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_pkg else parts)] = (f, is_pkg)
    return out


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    """Module -> the package's modules it imports, anywhere in its source."""
    mods = modules(root, package)

    def known(name: str) -> str | None:  # the module itself, or the package a name is taken from
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, (path, is_pkg) in mods.items():
        deps: set[str | None] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                deps |= {known(a.name) for a in node.names if a.name.split(".")[0] == package}
            elif isinstance(node, ast.ImportFrom):
                if node.level:  # relative: from the module's own package up
                    base = name.split(".")[: len(name.split(".")) + is_pkg - node.level]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                if source.split(".")[0] == package:
                    deps |= {known(f"{source}.{a.name}") if f"{source}.{a.name}" in mods else known(source)
                             for a in node.names}
        direct = {d for d in deps if d is not None and d != name}
        graph[name] = direct | {p for d in direct for p in _packages_above(d) if not _inside(name, p)}
    return graph


def _packages_above(module: str) -> list[str]:
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _inside(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as [a, b, ..., a], or None: a depth-first walk that meets a module
    still on its path."""
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def walk(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := walk(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := walk(node)):
            return found
    return None


def test_the_package_has_no_import_cycle():
    graph = import_graph(PACKAGE, "prefixstudy")
    assert len(graph) > 100 and "prefixstudy.engines.registry" in graph["prefixstudy.config.schema"]
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def _fake_package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "fake"
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_a_cycle_through_a_lazy_and_a_type_only_import_is_found(tmp_path):
    root = _fake_package(tmp_path, {
        "__init__.py": "",
        "config.py": "def f():\n    from fake.engines import registry\n",
        "engines/__init__.py": "from fake.engines.registry import BACKENDS\n",
        "engines/registry.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from fake.config import X\n",
        "plain.py": "import fake.config\nimport os\n",
    })
    graph = import_graph(root, "fake")
    assert graph["fake.config"] == {"fake.engines", "fake.engines.registry"}  # engines/__init__ runs first
    assert graph["fake.engines"] == {"fake.engines.registry"}  # a package's __init__ importing its submodule
    assert graph["fake.plain"] == {"fake.config"}
    assert find_cycle(graph) == ["fake.config", "fake.engines", "fake.engines.registry", "fake.config"]


def test_a_cycle_through_a_package_init_is_found(tmp_path):
    """config needs only engines.base, but importing it runs engines/__init__, which needs config."""
    root = _fake_package(tmp_path, {
        "__init__.py": "",
        "config.py": "from fake.engines.base import Engine\n",
        "engines/__init__.py": "from fake.config import StudyConfig\n",
        "engines/base.py": "",
    })
    assert find_cycle(import_graph(root, "fake")) == ["fake.config", "fake.engines", "fake.config"]


def test_relative_imports_and_a_graph_without_a_cycle(tmp_path):
    root = _fake_package(tmp_path, {
        "__init__.py": "from . import a\n",
        "a.py": "from .b import thing\n",
        "b.py": "from fake import c\n",
        "c.py": "",
    })
    graph = import_graph(root, "fake")
    assert graph == {"fake": {"fake.a"}, "fake.a": {"fake.b"}, "fake.b": {"fake.c"}, "fake.c": set()}
    assert find_cycle(graph) is None


# The stages from the ground up: a module imports only from its own stage and the stages before it.
# The package's own __init__ stands apart: it hands a notebook ``load`` and ``EnginePool`` on use,
# and the manifest reads its ``__version__``.
LAYERS = [
    {"errors", "schema", "shared"},
    {"engines", "configs"},
    {"config"},
    {"costmodel", "workloads"},
    {"metrics", "runner"},
    {"results"},
    {"executors"},
    {"model", "sim"},
    {"study"},
    {"sweep"},
    {"report"},
    {"cli"},
    {"__main__"},
]


def stage(module: str) -> str:
    return module.split(".")[1]


def imports_up(graph: dict[str, set[str]], layers: list[set[str]]) -> list[str]:
    """Every import of a module from a stage above the importer's, as 'a -> b'."""
    rank = {name: i for i, layer in enumerate(layers) for name in layer}
    return sorted(f"{a} -> {b}" for a, deps in graph.items() for b in deps
                  if "." in a and "." in b and rank[stage(b)] > rank[stage(a)])


def test_every_stage_is_in_a_layer_and_none_imports_from_a_later_one():
    graph = import_graph(PACKAGE, "prefixstudy")
    stages = {stage(m) for m in graph if "." in m}
    assert stages == set().union(*LAYERS)
    assert "prefixstudy.costmodel.engine_fit" in graph["prefixstudy.metrics.headline"]
    assert imports_up(graph, LAYERS) == []


def test_an_import_from_a_later_stage_is_named():
    graph = {"fake.low.a": {"fake.high.b"}, "fake.high.b": {"fake.low.c"}, "fake.low.c": set(), "fake": {"fake.high.b"}}
    assert imports_up(graph, [{"low"}, {"high"}]) == ["fake.low.a -> fake.high.b"]
