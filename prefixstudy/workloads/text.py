"""Import text prompts, tokenized with a real tokenizer (the Mistral v3 one by default)."""

from __future__ import annotations

from pathlib import Path

from prefixstudy.errors import UserError
from prefixstudy.workloads.base import DatasetRow
from prefixstudy.workloads.jsonl import json_lines, pos_int

# The Mistral v3 tokenizer (Mistral-7B-v0.3's) ships inside mistral_common.
MISTRAL_V3_TOKENIZER = "data/mistral_instruct_tokenizer_240323.model.v3"


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
    for n, obj in json_lines(path):
        if not isinstance(obj.get("prompt"), str):
            raise UserError(f"{path}:{n}: field 'prompt': expected a string")
        ids = inner.encode(obj["prompt"], bos=True, eos=False)
        out = pos_int(obj.get("output_len", output_len), f"{path}:{n}: field 'output_len'")
        rows.append(DatasetRow(f"x{n:06d}", ids, out, int(obj.get("group", 0))))
    if not rows:
        raise UserError(f"{path}: dataset is empty")
    return rows
