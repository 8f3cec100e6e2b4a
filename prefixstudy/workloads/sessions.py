"""Workload ``sessions``: multi-turn conversations whose history grows turn by turn.

Session s belongs to prefix group s % ``dataset.groups`` (its system prompt, ``prefix_len``
tokens).  Turn 0 is that prefix + a first user message (``suffix_len``); turn k's prompt is turn
k-1's prompt + the tokens turn k-1 generated + ``user_len`` new user tokens.  The generated tokens
are known only once turn k-1 has run, so a later turn's row holds only its new user tokens and
names its parent; the runner sends it ``think_time_s`` after the parent finished, with the
parent's real generated ids in its prompt.  Sessions start on the arrival schedule.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from prefixstudy.errors import UserError
from prefixstudy.workloads.base import DatasetRow, synthetic_count, token_high
from prefixstudy.config.workload_specs import SessionsConfig
from prefixstudy.workloads.lengths import Length, draw, lowest

if TYPE_CHECKING:
    from prefixstudy.config import StudyConfig


def rows(cfg: "StudyConfig", vocab: int) -> tuple[list[DatasetRow], str]:
    d = cfg.dataset
    s = d.sessions or SessionsConfig()
    n = synthetic_count(cfg)
    high = token_high(d, vocab)
    if lowest(s.turns) < 1:
        raise UserError("field 'dataset.sessions.turns': a session has at least 1 turn")
    if lowest(s.user_len) < 1:
        raise UserError("field 'dataset.sessions.user_len': lengths must be >= 1")
    out_len = s.output_len if s.output_len is not None else d.output_len
    if lowest(out_len) < 1:
        raise UserError("field 'dataset.sessions.output_len': lengths must be >= 1")
    return make_sessions(n, d.groups, d.prefix_len, d.suffix_len, out_len, s, d.seed, d.token_low, high), \
        "dataset (sessions)"


def make_sessions(n: int, groups: int, prefix_len: int, suffix_len: int, output_len: Length, s: SessionsConfig,
                  seed: int = 0, token_low: int = 100, token_high: int = 32768) -> list[DatasetRow]:
    """Sessions one after the other in the list (each turn after its parent), cut at n rows."""
    rng = np.random.default_rng(seed)
    prefixes = rng.integers(token_low, token_high, size=(groups, prefix_len))
    out: list[DatasetRow] = []
    session = 0
    while len(out) < n:
        turns = int(draw(s.turns, rng, 1)[0])
        outs = draw(output_len, rng, turns)
        for k in range(turns):
            if k == 0:
                ids = np.concatenate([prefixes[session % groups],
                                      rng.integers(token_low, token_high, size=max(suffix_len, 1))])
                parent = -1
            else:
                ids = rng.integers(token_low, token_high, size=int(draw(s.user_len, rng, 1)[0]))
                parent = len(out) - 1
            think = s.think_time_s if s.think == "fixed" or k == 0 else float(rng.exponential(s.think_time_s))
            out.append(DatasetRow(f"s{session:05d}t{k:03d}", ids.tolist(), int(outs[k]), session % groups,
                                  session=session, turn=k, parent=parent, think_time_s=think if k else 0.0))
        session += 1
    return out[:n]
