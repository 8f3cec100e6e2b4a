"""The study configs and model folders shipped inside the package, found from any directory.

``<name>.yaml`` here is a study (``prefixstudy run <name>``); ``models/<name>/config.json`` is a model
architecture a config's ``model:`` may name (engines run it with dummy weights).
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from prefixstudy.errors import UserError

DEFAULT = "default"


def _root() -> Path:
    # A wheel or an editable install puts the package on disk, so the traversable is a real path.
    return Path(str(resources.files(__name__)))


def shipped_configs() -> list[str]:
    """The names of the shipped study configs, sorted (``default``, ``h200-tp1``, ...)."""
    return sorted(p.stem for p in _root().glob("*.yaml"))


def shipped_models() -> list[str]:
    """The names of the shipped model folders (``mistral-7b-v0.3``, ``tiny-llama``)."""
    return sorted(p.parent.name for p in _root().glob("models/*/config.json"))


def shipped_config(name: str) -> Path | None:
    """The shipped config called ``name`` (``h200-tp1`` or ``h200-tp1.yaml``), or None."""
    stem = name[:-5] if name.endswith(".yaml") else name
    p = _root() / f"{stem}.yaml"
    return p if "/" not in name and "\\" not in name and p.is_file() else None


def shipped_model_dir(name: str) -> Path | None:
    """The shipped model folder called ``name`` (it holds a config.json), or None."""
    p = _root() / "models" / name
    return p if "/" not in name and "\\" not in name and (p / "config.json").is_file() else None


def recorded_model_dir(model: str) -> Path | None:
    """The folder of a model a run recorded (its config.yaml's ``model``): the path itself where its
    config.json is on this machine, else the shipped model of the same name (a run made on another
    machine); None: neither."""
    path = Path(model)
    if (path / "config.json").is_file():
        return path
    return shipped_model_dir(path.name)


def resolve_config(name_or_path: str | Path | None) -> Path:
    """What ``prefixstudy run CONFIG`` reads: an existing file as given; else a shipped name;
    no argument: the shipped ``default``.  A bare name that is neither is one clear error; a
    missing path is left for the reader to report as a missing file."""
    if name_or_path is None:
        return _root() / f"{DEFAULT}.yaml"
    p = Path(name_or_path)
    if p.exists():
        return p
    s = str(name_or_path)
    shipped = shipped_config(s)
    if shipped is not None:
        return shipped
    if p.suffix in (".yaml", ".yml") or len(p.parts) > 1:
        return p  # a path: read_yaml says "config file not found"
    raise UserError(f"'{s}' is not a config file nor a shipped config; shipped: {', '.join(shipped_configs())}")
