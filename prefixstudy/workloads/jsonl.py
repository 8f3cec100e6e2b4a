"""Workload ``jsonl``: replay a file of prefixstudy's own JSONL
(``{"request_id", "prompt_token_ids", "output_len", "group"}`` per line), and the line readers the
other file formats share."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from prefixstudy.errors import UserError, read_text
from prefixstudy.workloads.base import EXTRA_DEFAULTS, DatasetRow

if TYPE_CHECKING:
    from prefixstudy.config import StudyConfig


def rows(cfg: "StudyConfig", vocab: int) -> tuple[list[DatasetRow], str]:
    return load_jsonl(cfg.dataset.path), str(cfg.dataset.path)


def save_jsonl(rows: list[DatasetRow], path: Path) -> None:
    from prefixstudy.shared.files import atomic_write_text

    def line(r: DatasetRow) -> str:
        # Session and trace fields only where they differ from their defaults: plain rows stay as before.
        d = {k: v for k, v in asdict(r).items() if k not in EXTRA_DEFAULTS or v != EXTRA_DEFAULTS[k]}
        return json.dumps(d) + "\n"

    atomic_write_text(Path(path), "".join(line(r) for r in rows))


def int_list(v, where: str) -> list[int]:
    if not isinstance(v, list) or not v:
        raise UserError(f"{where}: expected a non-empty list of token ids")
    for t in v:
        if isinstance(t, bool) or not isinstance(t, int) or t < 0:
            raise UserError(f"{where}: token ids must be integers >= 0, got {t!r}")
    return v


def pos_int(v, where: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise UserError(f"{where}: expected an integer > 0, got {v!r}")
    return v


def read_dataset_text(path: Path) -> str:
    return read_text(path, "dataset file", "a dataset file")


def json_lines(path: Path):
    for n, line in enumerate(read_dataset_text(path).splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise UserError(f"{path}:{n}: malformed JSON ({e.msg})") from None
        except RecursionError:
            raise UserError(f"{path}:{n}: malformed JSON (nested too deep)") from None
        if not isinstance(obj, dict):
            raise UserError(f"{path}:{n}: expected a JSON object per line")
        yield n, obj


def _extras(obj: dict, where: str, index: int) -> dict:
    """The session / trace fields of one line, checked (a parent must be an earlier line)."""
    out = {}
    for k in ("session", "turn", "parent"):
        v = obj.get(k, EXTRA_DEFAULTS[k])
        if isinstance(v, bool) or not isinstance(v, int) or v < EXTRA_DEFAULTS[k]:
            raise UserError(f"{where}: field '{k}': expected an integer >= {EXTRA_DEFAULTS[k]}, got {v!r}")
        out[k] = v
    if out["parent"] >= index:
        raise UserError(f"{where}: field 'parent': {out['parent']} is not an earlier row (0-based)")
    for k in ("think_time_s", "arrival_s"):
        v = obj.get(k, EXTRA_DEFAULTS[k])
        if (v is None and k == "think_time_s") or \
                (v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0)):
            raise UserError(f"{where}: field '{k}': expected a number >= 0, got {v!r}")
        out[k] = None if v is None else float(v)
    return out


def load_jsonl(path: Path) -> list[DatasetRow]:
    """Read prefixstudy's own JSONL: {"request_id", "prompt_token_ids", "output_len", "group"}."""
    rows, seen = [], set()
    known = {"request_id", "prompt_token_ids", "output_len", "group", *EXTRA_DEFAULTS}
    for n, obj in json_lines(path):
        extra = set(obj) - known
        if extra:
            raise UserError(f"{path}:{n}: unknown field '{sorted(extra)[0]}'")
        for k in ("prompt_token_ids", "output_len"):
            if k not in obj:
                raise UserError(f"{path}:{n}: missing field '{k}'")
        rid = str(obj.get("request_id", f"r{n:06d}"))
        if rid in seen:
            raise UserError(f"{path}:{n}: duplicate request_id '{rid}'")
        seen.add(rid)
        group = obj.get("group", 0)
        if isinstance(group, bool) or not isinstance(group, int) or group < 0:
            raise UserError(f"{path}:{n}: field 'group': expected an integer >= 0, got {group!r}")
        rows.append(DatasetRow(
            rid,
            int_list(obj["prompt_token_ids"], f"{path}:{n}: field 'prompt_token_ids'"),
            pos_int(obj["output_len"], f"{path}:{n}: field 'output_len'"),
            group, **_extras(obj, f"{path}:{n}", len(rows)),
        ))
    if not rows:
        raise UserError(f"{path}: dataset is empty")
    return rows
