"""Workload ``trace``: replay a block-hash trace (Mooncake FAST'25 or Qwen-Bailian layout).

A trace line gives a request's arrival time, its input and output lengths and the hashes of its
prompt's blocks (``hash_ids``), never the tokens.  Tokens are made from the hashes: each hash id
becomes one fixed block of random tokens (seeded by the id), so equal hash ids are identical token
blocks and different ids are different blocks; the last block is cut to what ``input_length``
leaves.  Arrivals: the recorded timestamps, as recorded or scaled to each point's rate, or the
study's arrival process (``dataset.trace.replay``).

Layouts (one JSON object per line):

* ``mooncake``: ``timestamp`` (ms), ``input_length``, ``output_length``, ``hash_ids`` of 512-token
  blocks (github.com/kvcache-ai/Mooncake, FAST25-release/traces);
* ``bailian``: ``timestamp`` (s), ``input_length``, ``output_length``, ``hash_ids`` of 16-token
  blocks; ``chat_id`` / ``parent_chat_id`` / ``turn`` / ``type`` are read past (the hashes already
  carry a conversation's history).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from prefixstudy.errors import UserError
from prefixstudy.workloads.base import DatasetRow, token_high
from prefixstudy.config.workload_specs import TraceConfig
from prefixstudy.workloads.jsonl import json_lines, pos_int

if TYPE_CHECKING:
    from prefixstudy.config import StudyConfig

LAYOUTS = {  # layout -> (seconds per timestamp unit, tokens per hash block, fields read past)
    "mooncake": (1e-3, 512, set()),
    "bailian": (1.0, 16, {"chat_id", "parent_chat_id", "turn", "type"}),
}
REQUIRED = ("timestamp", "input_length", "output_length", "hash_ids")


def rows(cfg: "StudyConfig", vocab: int) -> tuple[list[DatasetRow], str]:
    d = cfg.dataset
    t = d.trace or TraceConfig()
    high = token_high(d, vocab)
    return load_trace(d.path, t, d.seed, d.token_low, high), str(d.path)


def _hash_ids(v, where: str, input_length: int, block: int) -> list[int]:
    if not isinstance(v, list) or not v:
        raise UserError(f"{where}: field 'hash_ids': expected a non-empty list of integers")
    for h in v:
        if isinstance(h, bool) or not isinstance(h, int) or h < 0:
            raise UserError(f"{where}: field 'hash_ids': expected integers >= 0, got {h!r}")
    if not (len(v) - 1) * block < input_length <= len(v) * block:
        raise UserError(f"{where}: field 'input_length': {input_length} tokens do not fit {len(v)} hash blocks "
                        f"of {block} tokens (needs {(len(v) - 1) * block + 1}..{len(v) * block})")
    return v


def _timestamp(v, where: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0:
        raise UserError(f"{where}: field 'timestamp': expected a number >= 0, got {v!r}")
    return float(v)


def load_trace(path: Path, t: TraceConfig, seed: int = 0, token_low: int = 100,
               token_high: int = 32768) -> list[DatasetRow]:
    unit_s, default_block, ignored = LAYOUTS[t.layout]
    block = t.hash_block_tokens or default_block
    blocks: dict[int, list[int]] = {}

    def tokens_of(h: int) -> list[int]:
        if h not in blocks:  # seeded by the id alone: the same id is the same block in every run
            blocks[h] = np.random.default_rng([seed, h]).integers(token_low, token_high, size=block).tolist()
        return blocks[h]

    out: list[DatasetRow] = []
    first_s = None
    for n, obj in json_lines(path):
        where = f"{path}:{n}"
        extra = set(obj) - set(REQUIRED) - ignored
        if extra:
            raise UserError(f"{where}: unknown field '{sorted(extra)[0]}' for the {t.layout} layout")
        for k in REQUIRED:
            if k not in obj:
                raise UserError(f"{where}: missing field '{k}'")
        ts = _timestamp(obj["timestamp"], where) * unit_s
        if first_s is not None and ts < out[-1].arrival_s + first_s:
            raise UserError(f"{where}: field 'timestamp': earlier than the line before (a trace is in time order)")
        first_s = ts if first_s is None else first_s
        n_in = pos_int(obj["input_length"], f"{where}: field 'input_length'")
        ids = [tok for h in _hash_ids(obj["hash_ids"], where, n_in, block) for tok in tokens_of(h)][:n_in]
        out.append(DatasetRow(f"trace{n:07d}", ids, pos_int(obj["output_length"], f"{where}: field 'output_length'"),
                              group=0, arrival_s=ts - first_s))
        if t.max_requests and len(out) == t.max_requests:
            break
    if not out:
        raise UserError(f"{path}: dataset is empty")
    return out


def trace_offsets(rows: list[DatasetRow], n: int, rate: float, replay: str) -> np.ndarray | None:
    """Send offsets (s) of the first n rows from their recorded times (the dataset wraps around
    after its last row, one recorded span later); None for ``drawn``."""
    if replay == "drawn":
        return None
    rec = np.array([r.arrival_s or 0.0 for r in rows])
    span = rec[-1] + (rec[-1] / (len(rec) - 1) if len(rec) > 1 else 1.0)
    t = np.array([rec[i % len(rec)] + (i // len(rec)) * span for i in range(n)])
    if replay == "scaled" and n > 1 and t[-1] > 0:
        t = t * ((n - 1) / rate) / t[-1]  # mean gap 1/rate, the recorded shape kept
    return t
