"""Stage: dataset.  Fixed-prompt requests composed at token level, saved as JSONL.

Hands the runner a list of ``DatasetRow``: one prompt (token ids) and one output length each.
A prompt is a shared prefix of its group (P tokens) plus a unique suffix (S tokens); prompts
are never built by joining text, so the shared prefix is exact at token level.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from prefixstudy.errors import UserError, read_text

# The Mistral v3 tokenizer (Mistral-7B-v0.3's) ships inside mistral_common.
MISTRAL_V3_TOKENIZER = "data/mistral_instruct_tokenizer_240323.model.v3"


@dataclass(frozen=True)
class DatasetRow:
    request_id: str
    prompt_token_ids: list[int]
    output_len: int
    group: int = 0


def make_dataset(
    num_requests: int,
    prefix_len: int = 1198,
    suffix_len: int = 16,
    output_len: int = 143,
    groups: int = 1,
    seed: int = 0,
    token_low: int = 100,
    token_high: int = 32768,
) -> list[DatasetRow]:
    """Request i belongs to group i % groups and gets that group's prefix plus its own suffix."""
    if num_requests <= 0 or groups <= 0 or output_len <= 0:
        raise UserError("dataset: num_requests, groups and output_len must be > 0")
    if prefix_len < 0 or suffix_len < 0 or prefix_len + suffix_len == 0:
        raise UserError("dataset: prefix_len and suffix_len must be >= 0 and not both 0")
    if not 0 <= token_low < token_high:
        raise UserError(f"dataset: token range [{token_low}, {token_high}) is empty")
    rng = np.random.default_rng(seed)
    prefixes = rng.integers(token_low, token_high, size=(groups, prefix_len))
    suffixes = rng.integers(token_low, token_high, size=(num_requests, suffix_len))
    rows = []
    for i in range(num_requests):
        g = i % groups
        ids = np.concatenate([prefixes[g], suffixes[i]]).tolist()
        rows.append(DatasetRow(f"r{i:06d}", ids, output_len, g))
    return rows


def save_jsonl(rows: list[DatasetRow], path: Path) -> None:
    from prefixstudy.results import atomic_write_text

    atomic_write_text(Path(path), "".join(json.dumps(asdict(r)) + "\n" for r in rows))


def _int_list(v, where: str) -> list[int]:
    if not isinstance(v, list) or not v:
        raise UserError(f"{where}: expected a non-empty list of token ids")
    for t in v:
        if isinstance(t, bool) or not isinstance(t, int) or t < 0:
            raise UserError(f"{where}: token ids must be integers >= 0, got {t!r}")
    return v


def _pos_int(v, where: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise UserError(f"{where}: expected an integer > 0, got {v!r}")
    return v


def _read_text(path: Path) -> str:
    return read_text(path, "dataset file", "a dataset file")


def _json_lines(path: Path):
    for n, line in enumerate(_read_text(path).splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise UserError(f"{path}:{n}: malformed JSON ({e.msg})") from None
        if not isinstance(obj, dict):
            raise UserError(f"{path}:{n}: expected a JSON object per line")
        yield n, obj


def load_jsonl(path: Path) -> list[DatasetRow]:
    """Read prefixstudy's own JSONL: {"request_id", "prompt_token_ids", "output_len", "group"}."""
    rows, seen = [], set()
    known = {"request_id", "prompt_token_ids", "output_len", "group"}
    for n, obj in _json_lines(path):
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
            _int_list(obj["prompt_token_ids"], f"{path}:{n}: field 'prompt_token_ids'"),
            _pos_int(obj["output_len"], f"{path}:{n}: field 'output_len'"),
            group,
        ))
    if not rows:
        raise UserError(f"{path}: dataset is empty")
    return rows


def import_trtllm(path: Path) -> list[DatasetRow]:
    """TensorRT-LLM token datasets, both shapes.

    prepare_dataset.py JSONL: {"task_id", "input_ids", "output_tokens"} per line;
    gptManagerBenchmark JSON: {"metadata", "samples": [{"input_ids", "output_len", "task_id"}]}.
    Groups are assigned by identical first 64 tokens, so shared prefixes group together.
    """
    text = _read_text(path)
    stripped = text.lstrip()
    items: list[tuple[str, dict]] = []
    if stripped.startswith("{") and '"samples"' in stripped[:100000] and "\n{" not in stripped.strip():
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as e:
            raise UserError(f"{path}: line {e.lineno}: malformed JSON ({e.msg})") from None
        samples = doc.get("samples")
        if not isinstance(samples, list):
            raise UserError(f"{path}: field 'samples': expected a list")
        items = [(f"{path}: samples[{i}]", s) for i, s in enumerate(samples)]
        out_key = "output_len"
    else:
        items = [(f"{path}:{n}", o) for n, o in _json_lines(path)]
        out_key = "output_tokens"
    rows, groups, seen = [], {}, set()
    for where, s in items:
        if not isinstance(s, dict):
            raise UserError(f"{where}: expected a JSON object")
        for k in ("input_ids", out_key):
            if k not in s:
                raise UserError(f"{where}: missing field '{k}'")
        ids = _int_list(s["input_ids"], f"{where}: field 'input_ids'")
        g = groups.setdefault(tuple(ids[:64]), len(groups))
        rid = str(s.get("task_id", len(rows)))
        if rid in seen:  # the engine refuses a repeated request id
            raise UserError(f"{where}: duplicate task_id '{rid}'")
        seen.add(rid)
        rows.append(DatasetRow(f"t{rid}", ids, _pos_int(s[out_key], f"{where}: field '{out_key}'"), g))
    if not rows:
        raise UserError(f"{path}: dataset is empty")
    return rows


def mistral_v3_tokenizer_path() -> Path:
    try:
        import mistral_common
    except ImportError:
        raise UserError("tokenizing text needs the mistral_common package (pip install mistral_common)") from None
    return Path(mistral_common.__file__).parent / MISTRAL_V3_TOKENIZER


def import_text(path: Path, output_len: int, tokenizer: Path | None = None) -> list[DatasetRow]:
    """JSONL of {"prompt": text, "output_len"?: int, "group"?: int}, tokenized with a real tokenizer
    (the Mistral v3 tokenizer by default)."""
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

    tok = MistralTokenizer.from_file(str(tokenizer or mistral_v3_tokenizer_path()))
    inner = tok.instruct_tokenizer.tokenizer
    rows = []
    for n, obj in _json_lines(path):
        if not isinstance(obj.get("prompt"), str):
            raise UserError(f"{path}:{n}: field 'prompt': expected a string")
        ids = inner.encode(obj["prompt"], bos=True, eos=False)
        out = _pos_int(obj.get("output_len", output_len), f"{path}:{n}: field 'output_len'")
        rows.append(DatasetRow(f"x{n:06d}", ids, out, int(obj.get("group", 0))))
    if not rows:
        raise UserError(f"{path}: dataset is empty")
    return rows


def validate(rows: list[DatasetRow], vocab_size: int, max_model_len: int, source: str) -> None:
    """Token ids must be < vocab size and prompt + output must fit the model's context."""
    for i, r in enumerate(rows, 1):
        bad = max(r.prompt_token_ids)
        if bad >= vocab_size:
            raise UserError(f"{source}: request {i} ('{r.request_id}'): token id {bad} >= vocab size {vocab_size}")
        total = len(r.prompt_token_ids) + r.output_len
        if total > max_model_len:
            raise UserError(
                f"{source}: request {i} ('{r.request_id}'): prompt {len(r.prompt_token_ids)} + output "
                f"{r.output_len} = {total} tokens > engine.max_model_len {max_model_len}")


def describe(rows: list[DatasetRow]) -> dict:
    lens = np.array([len(r.prompt_token_ids) for r in rows])
    outs = np.array([r.output_len for r in rows])
    return {
        "requests": len(rows),
        "groups": len({r.group for r in rows}),
        "prompt_tokens_min": int(lens.min()), "prompt_tokens_max": int(lens.max()),
        "output_tokens_min": int(outs.min()), "output_tokens_max": int(outs.max()),
        "max_sequence_tokens": int((lens + outs).max()),
        "shared_prefix_tokens": shared_prefix_len(rows),
    }


def shared_prefix_len(rows: list[DatasetRow]) -> int:
    """Longest prefix that every prompt in group 0 shares (the fixed instruction)."""
    g0 = [r.prompt_token_ids for r in rows if r.group == rows[0].group]
    first = g0[0]
    n = len(first)
    for p in g0[1:]:
        m = min(n, len(p))
        a, b = np.asarray(first[:m]), np.asarray(p[:m])
        diff = np.nonzero(a != b)[0]
        n = int(diff[0]) if len(diff) else m
    return n
