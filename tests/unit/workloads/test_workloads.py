import json

import pytest

from prefixstudy.workloads.base import DatasetRow, block_floor, describe, expected_cached, group_prefixes, validate
from prefixstudy.workloads.fixed import make_dataset
from prefixstudy.workloads.jsonl import load_jsonl, save_jsonl
from prefixstudy.workloads.text import import_text, mistral_v3_tokenizer_path
from prefixstudy.workloads.trtllm import import_trtllm
from prefixstudy.errors import UserError


def test_make_dataset_composes_prefix_and_suffix_at_token_level():
    rows = make_dataset(6, prefix_len=10, suffix_len=3, output_len=7, groups=2, seed=1, token_low=5, token_high=50)
    assert [r.group for r in rows] == [0, 1, 0, 1, 0, 1]
    assert all(len(r.prompt_token_ids) == 13 and r.output_len == 7 for r in rows)
    assert rows[0].prompt_token_ids[:10] == rows[2].prompt_token_ids[:10] == rows[4].prompt_token_ids[:10]
    assert rows[1].prompt_token_ids[:10] == rows[3].prompt_token_ids[:10]
    assert rows[0].prompt_token_ids[:10] != rows[1].prompt_token_ids[:10]
    assert len({tuple(r.prompt_token_ids[10:]) for r in rows}) == 6
    assert all(5 <= t < 50 for r in rows for t in r.prompt_token_ids)
    assert [r.request_id for r in rows[:2]] == ["r000000", "r000001"]


def test_make_dataset_is_seeded():
    a = make_dataset(3, 20, 4, 5, seed=7)
    b = make_dataset(3, 20, 4, 5, seed=7)
    c = make_dataset(3, 20, 4, 5, seed=8)
    assert a == b and a != c


def test_default_shape_is_the_seed_case():
    rows = make_dataset(4)
    d = describe(rows)
    assert d == {"requests": 4, "groups": 1, "prompt_tokens_min": 1214, "prompt_tokens_max": 1214,
                 "output_tokens_min": 143, "output_tokens_max": 143, "max_sequence_tokens": 1357,
                 "shared_prefix_tokens": 1198}


def test_jsonl_round_trip(tmp_path):
    rows = make_dataset(5, 8, 2, 3, groups=2)
    p = tmp_path / "d.jsonl"
    save_jsonl(rows, p)
    first = json.loads(p.read_text().splitlines()[0])
    assert set(first) == {"request_id", "prompt_token_ids", "output_len", "group"}
    assert load_jsonl(p) == rows


def test_malformed_line_names_file_and_line(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text('{"prompt_token_ids": [1, 2], "output_len": 3}\n{"prompt_token_ids": [1,\n')
    with pytest.raises(UserError, match=r"d\.jsonl:2: malformed JSON"):
        load_jsonl(p)


def test_validate_rejects_token_at_vocab_and_too_long():
    rows = [DatasetRow("a", [1, 2, 32768], 4)]
    with pytest.raises(UserError, match="token id 32768 >= vocab size 32768"):
        validate(rows, 32768, 100, "x.jsonl")
    rows = [DatasetRow("a", [1] * 90, 11)]
    with pytest.raises(UserError, match=r"prompt 90 \+ output 11 = 101 tokens > engine.max_model_len 100"):
        validate(rows, 32768, 100, "x.jsonl")


def test_import_trtllm_prepare_dataset_jsonl(tmp_path):
    shared = list(range(100, 170))  # 70 shared tokens: prompts that agree on their first 64 share a group
    lines = [{"task_id": 0, "input_ids": shared + [1], "output_tokens": 4},
             {"task_id": 1, "input_ids": shared + [2], "output_tokens": 2},
             {"task_id": 2, "input_ids": [9] + shared, "output_tokens": 3}]
    p = tmp_path / "t.jsonl"
    p.write_text("".join(json.dumps(x) + "\n" for x in lines))
    rows = import_trtllm(p)
    assert [(r.request_id, r.output_len, r.group) for r in rows] == [("t0", 4, 0), ("t1", 2, 0), ("t2", 3, 1)]
    assert rows[1].prompt_token_ids == shared + [2]


def test_import_trtllm_gpt_manager_json(tmp_path):
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"metadata": {"workload_type": "token-norm-dist"},
                             "samples": [{"input_ids": [1, 2], "output_len": 9, "task_id": 3}]}, indent=2))
    assert import_trtllm(p) == [DatasetRow("t3", [1, 2], 9, 0)]


def test_import_trtllm_missing_field(tmp_path):
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"metadata": {}, "samples": [{"input_ids": [1, 2], "task_id": 3}]}))
    with pytest.raises(UserError, match=r"samples\[0\]: missing field 'output_len'"):
        import_trtllm(p)


def test_text_import_uses_mistral_v3_tokenizer(tmp_path):
    p = tmp_path / "x.jsonl"
    p.write_text('{"prompt": "Hello world"}\n')
    rows = import_text(p, output_len=5)
    # BOS (1) then the v3 pieces for "Hello world".
    assert rows[0].prompt_token_ids[0] == 1 and rows[0].output_len == 5
    assert mistral_v3_tokenizer_path().name == "mistral_instruct_tokenizer_240323.model.v3"


def test_expected_cached_is_block_aligned_shared_prefix():
    pre = list(range(1198))
    rows = [DatasetRow(f"r{i}", pre + [5000 + 16 * i + k for k in range(16)], 4) for i in range(3)]
    prefixes = group_prefixes(rows)
    assert len(prefixes[0]) == 1198
    assert block_floor(1198, 128) == 1152 and block_floor(1198, 16) == 1184
    # Primed: every request hits; not primed: the first request of the group misses.
    assert expected_cached(rows, prefixes, 128, warm_groups={0}) == [1152, 1152, 1152]
    assert expected_cached(rows, prefixes, 16, warm_groups=set()) == [0, 1184, 1184]
