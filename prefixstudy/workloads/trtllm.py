"""Import TensorRT-LLM token datasets into prefixstudy rows."""

from __future__ import annotations

import json
from pathlib import Path

from prefixstudy.errors import UserError
from prefixstudy.workloads.base import DatasetRow
from prefixstudy.workloads.jsonl import int_list, json_lines, pos_int, read_dataset_text


def import_trtllm(path: Path) -> list[DatasetRow]:
    """TensorRT-LLM token datasets, both shapes.

    prepare_dataset.py JSONL: {"task_id", "input_ids", "output_tokens"} per line;
    gptManagerBenchmark JSON: {"metadata", "samples": [{"input_ids", "output_len", "task_id"}]}.
    Groups are assigned by identical first 64 tokens, so shared prefixes group together.
    """
    text = read_dataset_text(path)
    stripped = text.lstrip()
    items: list[tuple[str, dict]] = []
    if stripped.startswith("{") and '"samples"' in stripped[:100000] and "\n{" not in stripped.strip():
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as e:
            raise UserError(f"{path}: line {e.lineno}: malformed JSON ({e.msg})") from None
        except RecursionError:
            raise UserError(f"{path}: malformed JSON (nested too deep)") from None
        samples = doc.get("samples")
        if not isinstance(samples, list):
            raise UserError(f"{path}: field 'samples': expected a list")
        items = [(f"{path}: samples[{i}]", s) for i, s in enumerate(samples)]
        out_key = "output_len"
    else:
        items = [(f"{path}:{n}", o) for n, o in json_lines(path)]
        out_key = "output_tokens"
    rows, groups, seen = [], {}, set()
    for where, s in items:
        if not isinstance(s, dict):
            raise UserError(f"{where}: expected a JSON object")
        for k in ("input_ids", out_key):
            if k not in s:
                raise UserError(f"{where}: missing field '{k}'")
        ids = int_list(s["input_ids"], f"{where}: field 'input_ids'")
        g = groups.setdefault(tuple(ids[:64]), len(groups))
        rid = str(s.get("task_id", len(rows)))
        if rid in seen:  # the engine refuses a repeated request id
            raise UserError(f"{where}: duplicate task_id '{rid}'")
        seen.add(rid)
        rows.append(DatasetRow(f"t{rid}", ids, pos_int(s[out_key], f"{where}: field '{out_key}'"), g))
    if not rows:
        raise UserError(f"{path}: dataset is empty")
    return rows
