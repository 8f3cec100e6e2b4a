"""Stage: workloads, the rows.  What every workload hands the runner: a list of ``DatasetRow``
(one prompt as token ids, one output length, a prefix group), and what is known of their shared
prefixes: per group, the tokens every prompt of the group starts with, and so how many prompt
tokens a prefix cache should serve."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from prefixstudy.errors import UserError


@dataclass(frozen=True)
class DatasetRow:
    """One request.  A row with a ``parent`` (the dataset index of an earlier row) is a later turn
    of a session: it is sent ``think_time_s`` after its parent finished, and its prompt is the
    parent's prompt + the parent's generated tokens + ``prompt_token_ids`` (the new user tokens).
    ``arrival_s``: a recorded send time (trace replay), seconds from the trace's start."""

    request_id: str
    prompt_token_ids: list[int]
    output_len: int
    group: int = 0
    session: int = -1
    turn: int = 0
    parent: int = -1
    think_time_s: float = 0.0
    arrival_s: float | None = None


# The fields a row has beyond the first four, and their defaults (the JSONL omits defaults).
EXTRA_DEFAULTS = {"session": -1, "turn": 0, "parent": -1, "think_time_s": 0.0, "arrival_s": None}


def token_high(dataset, vocab: int) -> int:
    """The exclusive upper bound of drawn token ids: ``dataset.token_high``, at most the vocab."""
    high = dataset.token_high or vocab
    if high > vocab:
        raise UserError(f"field 'dataset.token_high': {high} > the model's vocab size {vocab}")
    return high


def synthetic_count(cfg) -> int:
    """Rows a generated workload makes: ``dataset.num_requests``, else as many as the largest point needs."""
    return cfg.dataset.num_requests or max(cfg.sweep.requests_for(r) for r in cfg.sweep.rate_extent())


def full_prompt_len(rows: list[DatasetRow], i: int) -> int:
    """Tokens in row i's prompt as sent: its own plus, for a later turn, every earlier turn's
    prompt and output."""
    n = 0
    while i >= 0:
        r = rows[i]
        n += len(r.prompt_token_ids) + (rows[r.parent].output_len if r.parent >= 0 else 0)
        i = r.parent
    return n


def validate(rows: list[DatasetRow], vocab_size: int, max_model_len: int, source: str) -> None:
    """Token ids must be < vocab size and prompt + output must fit the model's context."""
    for i, r in enumerate(rows, 1):
        bad = max(r.prompt_token_ids)
        if bad >= vocab_size:
            raise UserError(f"{source}: request {i} ('{r.request_id}'): token id {bad} >= vocab size {vocab_size}")
        if r.parent >= i - 1:
            raise UserError(f"{source}: request {i} ('{r.request_id}'): parent {r.parent} must be an earlier row")
        prompt = full_prompt_len(rows, i - 1)
        total = prompt + r.output_len
        if total > max_model_len:
            raise UserError(
                f"{source}: request {i} ('{r.request_id}'): prompt {prompt} + output "
                f"{r.output_len} = {total} tokens > engine.max_model_len {max_model_len}")


def describe(rows: list[DatasetRow]) -> dict:
    lens = np.array([full_prompt_len(rows, i) for i in range(len(rows))])
    outs = np.array([r.output_len for r in rows])
    shared = [len(p) for p in group_prefixes(rows).values()]
    return {
        "requests": len(rows),
        "groups": len({r.group for r in rows}),
        "prompt_tokens_min": int(lens.min()), "prompt_tokens_max": int(lens.max()),
        "output_tokens_min": int(outs.min()), "output_tokens_max": int(outs.max()),
        "max_sequence_tokens": int((lens + outs).max()),
        # The shortest group's shared prefix: one number for the common one-group case.
        "shared_prefix_tokens": int(min(shared)),
    }


def group_prefixes(rows: list[DatasetRow]) -> dict[int, list[int]]:
    """The tokens every prompt of a group shares (the fixed instruction), per group.  A group of
    one request shares nothing with anyone.  Later turns of sessions (rows with a parent) are left
    out: their rows hold only the new user tokens."""
    out: dict[int, list[int]] = {}
    counts: dict[int, int] = {}
    for r in rows:
        if r.parent >= 0:
            continue
        counts[r.group] = counts.get(r.group, 0) + 1
        p = out.get(r.group)
        if p is None:
            out[r.group] = list(r.prompt_token_ids)
            continue
        m = min(len(p), len(r.prompt_token_ids))
        a, b = np.asarray(p[:m]), np.asarray(r.prompt_token_ids[:m])
        d = np.nonzero(a != b)[0]
        del p[int(d[0]) if len(d) else m:]
    return {g: (p if counts[g] > 1 else []) for g, p in out.items()}


def block_floor(n: int, block: int) -> int:
    return (n // block) * block


def expected_cached(rows: list[DatasetRow], prefixes: dict[int, list[int]], block: int,
                    warm_groups: set[int]) -> list[int]:
    """Prompt tokens ON should serve from cache: the block-aligned shared prefix, once a request of
    its group has been through the engine in this point (primed, warm-up, or an earlier request)."""
    seen = set(warm_groups)
    out = []
    for r in rows:
        shared = min(len(prefixes.get(r.group, [])), len(r.prompt_token_ids) - 1)
        out.append(block_floor(shared, block) if r.group in seen else 0)
        seen.add(r.group)
    return out
