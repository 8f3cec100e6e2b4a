"""Reading a study config: YAML (bounded), ``--set`` overrides, one validation, the checks that
need the whole config, and the one-line message naming the field when it is refused."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from prefixstudy.config.arm_checks import check_arms
from prefixstudy.config.schema import ENGINE_CONFIGS, ENGINE_KINDS, StudyConfig
from prefixstudy.errors import UserError, read_text


def resolve_model_path(model: str, base: Path | None = None) -> str:
    """A relative model folder is looked up from the cwd, then the config's folder, then among the
    shipped models (``tiny-llama``, ``mistral-7b-v0.3``), and made absolute, so the saved config
    works from anywhere (vLLM would take it for a hub id)."""
    from prefixstudy.configs import shipped_model_dir

    p = Path(model)
    if p.is_absolute():
        return model
    for root in (Path.cwd(), base):
        if root is not None and (root / p).is_dir():
            return str((root / p).resolve())
    shipped = shipped_model_dir(model)
    return str(shipped.resolve()) if shipped is not None else model


def _fmt_error(err: ValidationError, source: str, overrides: dict | None = None) -> str:
    e = err.errors()[0]
    loc = list(e["loc"])
    if loc[:1] == ["engine"] and len(loc) > 1 and loc[1] in ENGINE_KINDS:
        del loc[1]  # pydantic names the union member; the user wrote engine.<field>
    msg = e["msg"]
    if e["type"] == "union_tag_invalid" and loc == ["engine"]:  # a kind no backend is registered for
        loc.append("kind")
        msg = (f"{e['ctx']['tag']!r} is no backend (one of: {', '.join(ENGINE_KINDS)}); "
               "several engines of one behind a router are `replicas` > 1")
    field = ".".join(str(x) for x in loc) or "(top level)"
    # A bad value that came from the command line is named by its flag, not by the file.
    for k in overrides or ():
        if field == k or field.startswith(f"{k}."):
            source = f"--set {k}"
    if e["type"] == "extra_forbidden":
        msg = "unknown key"
    return f"{source}: field '{field}': {msg}"


def parse_config(data: Any, source: str, overrides: dict | None = None) -> StudyConfig:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise UserError(f"{source}: expected a mapping of config keys, got {type(data).__name__}")
    try:
        cfg = StudyConfig.model_validate(data)
    except ValidationError as err:
        raise UserError(_fmt_error(err, source, overrides)) from None
    check_arms(cfg, source, overrides)
    check_sizes(cfg, source)
    return cfg


# Token ids the generated dataset may hold (8 GiB as int64): far past any study's, short of
# what would exhaust a machine's memory before the first request.
DATASET_MAX_TOKENS = 1 << 30


def check_sizes(cfg: StudyConfig, source: str) -> None:
    """Refuse, before anything is generated, a study whose generated dataset could not fit in
    memory: rows (the largest point's requests plus warm-ups) x prompt tokens, plus each group's
    shared prefix.  A replayed file (jsonl, trace) is bounded by the file itself."""
    d, sw = cfg.dataset, cfg.sweep
    if d.path is not None:
        return
    rows = max(max(sw.requests_for(r) for r in sw.rate_extent()) + sw.warmup_requests, d.num_requests or 0)
    tokens = rows * (d.prefix_len + d.suffix_len) + (d.groups * d.prefix_len if d.kind == "groups" else 0)
    if tokens > DATASET_MAX_TOKENS:
        raise UserError(f"{source}: field 'dataset': the generated dataset would hold {tokens:.3g} prompt tokens "
                        f"({rows:,} rows of {d.prefix_len + d.suffix_len:,} tokens"
                        + (f", {d.groups:,} group prefixes" if d.kind == "groups" else "")
                        + f"), more than {DATASET_MAX_TOKENS:.3g}; lower the request count, the prompt length "
                          "or the number of groups")


# A config is a page of settings: these bound what a mistaken or hostile file can make us do.
CONFIG_MAX_BYTES = 1 << 20
CONFIG_MAX_VALUES = 100_000  # after YAML aliases are expanded


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping (PyYAML keeps the last silently)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, (str, int, float, bool)) and key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key '{key}' is given twice", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _count_values(obj: Any, limit: int) -> int:
    """Values in ``obj``, walking shared (aliased) parts each time they appear, up to ``limit``."""
    n, stack = 0, [obj]
    while stack and n <= limit:
        x = stack.pop()
        n += 1
        if isinstance(x, dict):
            stack.extend(x.values())
        elif isinstance(x, list):
            stack.extend(x)
    return n


def read_yaml(path: Path) -> Any:
    text = read_text(path, "config file", "a YAML config file", max_bytes=CONFIG_MAX_BYTES)
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}:" if mark else ""
        problem = getattr(e, "problem", None) or str(e).strip().splitlines()[0]
        raise UserError(f"{path}:{where} invalid YAML: {problem}") from None
    except RecursionError:
        raise UserError(f"{path}: invalid YAML: nested too deep for a config") from None
    if _count_values(data, CONFIG_MAX_VALUES) > CONFIG_MAX_VALUES:
        raise UserError(f"{path}: expands to more than {CONFIG_MAX_VALUES:,} values (YAML aliases?); "
                        "a config is a few dozen")
    return data


def set_dotted(data: dict, dotted: str, value: Any) -> None:
    """Apply one ``--set a.b=c`` override onto raw config data."""
    keys = dotted.split(".")
    cur = data
    for k in keys[:-1]:
        nxt = cur.setdefault(k, {})
        if not isinstance(nxt, dict):
            raise UserError(f"--set {dotted}: '{k}' is not a section")
        cur = nxt
    cur[keys[-1]] = value


def _switch_kind(data: dict, path: Path | None, overrides: dict) -> None:
    """``--set engine.kind=K`` over a file written for another backend: the file's engine keys that
    K has no field for are dropped when the file is a shipped config (its engine section is the
    package's default, not the user's), and refused in one line naming the flag when the user wrote
    them.  Keys also given on the command line are the user's, and checked as usual."""
    kind = overrides.get("engine.kind")
    engine = data.get("engine")
    if path is None or kind not in ENGINE_CONFIGS or not isinstance(engine, dict) or engine.get("kind", "vllm") == kind:
        return
    from prefixstudy.configs import shipped_config

    fields = set(ENGINE_CONFIGS[kind].model_fields)
    stray = [k for k in engine if k not in fields and f"engine.{k}" not in overrides]
    if not stray:
        return
    shipped = shipped_config(path.name)
    if shipped is not None and shipped.resolve() == Path(path).resolve():
        data["engine"] = {k: v for k, v in engine.items() if k not in stray}
        return
    raise UserError(f"--set engine.kind={kind}: {path} sets field 'engine.{stray[0]}', which engine.kind {kind} "
                    f"has no field for; remove it from the file, or set engine.kind: {kind} there")


def load_config(path: Path | str | None, overrides: dict[str, Any] | None = None) -> StudyConfig:
    """Read a YAML config (or the defaults), apply dotted overrides, validate once."""
    path = Path(path) if path else None  # a str from Python as well as the CLI's Path
    source = str(path) if path else "(defaults)"
    data = read_yaml(path) if path else {}
    if data is None:
        # An empty file would otherwise run the shipped default vLLM study, which it did not ask for.
        raise UserError(f"{source}: no config keys (the file is empty or only comments); "
                        "run without a config for the default study")
    if not isinstance(data, dict):
        raise UserError(f"{source}: expected a mapping of config keys, got {type(data).__name__}")
    _switch_kind(data, path, overrides or {})
    for k, v in (overrides or {}).items():
        set_dotted(data, k, copy.deepcopy(v))  # a later dotted key must not edit the caller's dict
    cfg = parse_config(data, source, overrides)
    base = path.parent if path else None
    cfg.model = resolve_model_path(cfg.model, base)
    if cfg.dataset.path is not None and not cfg.dataset.path.is_absolute() and base is not None \
            and not cfg.dataset.path.exists() and (base / cfg.dataset.path).exists():
        cfg.dataset.path = (base / cfg.dataset.path).resolve()
    return cfg


def flat_config(d: dict, prefix: str = "") -> dict:
    """A config (as data) flattened to dotted keys, to name the first field where two differ."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(flat_config(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def dump_config(cfg: StudyConfig) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
