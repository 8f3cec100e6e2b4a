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
    request_id: str
    prompt_token_ids: list[int]
    output_len: int
    group: int = 0


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
    one request shares nothing with anyone."""
    out: dict[int, list[int]] = {}
    counts: dict[int, int] = {}
    for r in rows:
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
