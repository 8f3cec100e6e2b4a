"""The groups, sessions and trace workloads: exact rows from seeded generators and a fixture."""

import json
from pathlib import Path

import numpy as np
import pytest

from prefixstudy.config import load_config
from prefixstudy.errors import UserError
from prefixstudy.workloads import load_rows
from prefixstudy.workloads.groups import group_order, popularity
from prefixstudy.workloads.jsonl import load_jsonl, save_jsonl
from prefixstudy.workloads.lengths import LengthDist, draw
from prefixstudy.config.workload_specs import MixConfig, TraceConfig
from prefixstudy.workloads.trace import load_trace, trace_offsets

FIXTURE = Path(__file__).resolve().parents[2] / "data" / "mooncake_synthetic.jsonl"


def rows_for(**sets):
    return load_rows(load_config(None, sets))


def test_round_robin_uniform_and_zipf_orders():
    rng = np.random.default_rng(0)
    assert group_order(7, popularity(3, MixConfig()), MixConfig(), rng).tolist() == [0, 1, 2, 0, 1, 2, 0]
    z = MixConfig(popularity="zipf", zipf_exponent=1.0)
    assert popularity(3, z).tolist() == pytest.approx([6 / 11, 3 / 11, 2 / 11])
    # Smooth weighted round robin: 11 requests give each group exactly its share (6, 3, 2).
    order = group_order(11, popularity(3, z), z, rng).tolist()
    assert order == [0, 1, 0, 2, 0, 1, 0, 2, 0, 1, 0] and [order.count(g) for g in range(3)] == [6, 3, 2]


def test_bursty_order_runs_of_one_group():
    mix = MixConfig(order="bursty", burst_mean=4.0)
    order = group_order(400, popularity(5, mix), mix, np.random.default_rng(3))
    runs = 1 + int((np.diff(order) != 0).sum())
    assert 60 <= runs <= 140  # about 400 / 4 runs (a run may repeat the previous group)


def test_groups_rows_share_each_groups_prefix_and_draw_lengths():
    rows = rows_for(**{"dataset.kind": "groups", "dataset.groups": 3, "dataset.num_requests": 6,
                       "dataset.mix": {"prefix_len": {"dist": "choice", "values": [64, 128]},
                                       "suffix_len": {"dist": "uniform", "low": 4, "high": 9}, "output_len": 5}})
    assert [r.group for r in rows] == [0, 1, 2, 0, 1, 2] and {r.output_len for r in rows} == {5}
    for g in range(3):
        a, b = rows[g].prompt_token_ids, rows[g + 3].prompt_token_ids
        p = next(i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y)
        assert p in (64, 128) and 4 <= len(a) - p <= 9


def test_length_distributions():
    rng = np.random.default_rng(0)
    assert draw(7, rng, 3).tolist() == [7, 7, 7]
    n = draw(LengthDist(dist="normal", mean=100, std=10, low=95, high=105), rng, 500)
    assert n.min() == 95 and n.max() == 105
    ln = draw(LengthDist(dist="lognormal", mean=200, std=50, low=1), rng, 20000)
    assert abs(ln.mean() - 200) < 3


def test_sessions_rows_chain_turns_to_their_parents():
    rows = rows_for(**{"dataset.kind": "sessions", "dataset.groups": 2, "dataset.prefix_len": 32,
                       "dataset.suffix_len": 8, "dataset.output_len": 4, "dataset.num_requests": 7,
                       "dataset.sessions": {"turns": 3, "user_len": 5, "think_time_s": 0.5}})
    assert [(r.session, r.turn, r.parent, r.group, len(r.prompt_token_ids), r.think_time_s) for r in rows] == [
        (0, 0, -1, 0, 40, 0.0), (0, 1, 0, 0, 5, 0.5), (0, 2, 1, 0, 5, 0.5),
        (1, 0, -1, 1, 40, 0.0), (1, 1, 3, 1, 5, 0.5), (1, 2, 4, 1, 5, 0.5), (2, 0, -1, 0, 40, 0.0)]
    assert rows[0].prompt_token_ids[:32] == rows[6].prompt_token_ids[:32] != rows[3].prompt_token_ids[:32]


def test_sessions_too_long_for_the_model_are_refused():
    with pytest.raises(UserError, match=r"request 3 .*prompt 2060 \+ output 1000 = 3060 tokens > engine.max_model_len"):
        rows_for(**{"dataset.kind": "sessions", "dataset.prefix_len": 16, "dataset.suffix_len": 4,
                    "dataset.output_len": 1000, "dataset.num_requests": 3,
                    "dataset.sessions": {"turns": 3, "user_len": 20}})


def test_session_rows_round_trip_through_jsonl(tmp_path):
    rows = rows_for(**{"dataset.kind": "sessions", "dataset.num_requests": 4, "dataset.prefix_len": 8,
                       "dataset.sessions": {"turns": 2}})
    save_jsonl(rows, tmp_path / "s.jsonl")
    assert load_jsonl(tmp_path / "s.jsonl") == rows
    first = json.loads((tmp_path / "s.jsonl").read_text().splitlines()[0])
    assert set(first) == {"request_id", "prompt_token_ids", "output_len", "group", "session"}


def test_mooncake_fixture_equal_hash_ids_are_equal_blocks():
    rows = load_trace(FIXTURE, TraceConfig())
    assert [len(r.prompt_token_ids) for r in rows] == [1100, 1024, 700, 1600, 1300, 600, 1100, 300]
    assert [r.arrival_s for r in rows] == pytest.approx([0, 0.2, 0.45, 0.6, 0.9, 1.0, 1.3, 1.5])
    a, b, c, f = (rows[i].prompt_token_ids for i in (0, 1, 2, 5))
    assert a[:1024] == b and a[:512] == c[:512] and c[512:600] != a[512:600]
    assert f[512:600] == a[1024:1100][:76] + f[588:600] or f[512:588] == a[1024:1100]  # hash 3, cut to 88
    assert rows[6].prompt_token_ids == a
    assert rows[7].prompt_token_ids != a[:300]


def test_trace_offsets_scaled_recorded_drawn():
    rows = load_trace(FIXTURE, TraceConfig())
    assert trace_offsets(rows, 8, 7.0, "scaled").tolist() == pytest.approx(
        [t * (7 / 7.0) / 1.5 for t in [0, 0.2, 0.45, 0.6, 0.9, 1.0, 1.3, 1.5]])
    assert trace_offsets(rows, 3, 99.0, "recorded").tolist() == pytest.approx([0, 0.2, 0.45])
    assert trace_offsets(rows, 10, 1.0, "recorded")[8:].tolist() == pytest.approx([1.5 + 1.5 / 7, 1.7 + 1.5 / 7])
    assert trace_offsets(rows, 8, 1.0, "drawn") is None


@pytest.mark.parametrize("line, msg", [
    ('{"timestamp": 0, "input_length": 600, "output_length": 4, "hash_ids": [1]}',
     r"t.jsonl:1: field 'input_length': 600 tokens do not fit 1 hash blocks of 512 tokens \(needs 1..512\)"),
    ('{"timestamp": 0, "input_length": 10, "output_length": 4}', r"t.jsonl:1: missing field 'hash_ids'"),
    ('{"timestamp": -1, "input_length": 10, "output_length": 4, "hash_ids": [1]}', r"t.jsonl:1: field 'timestamp'"),
    ('{"timestamp": 0, "input_length": 10, "output_length": 0, "hash_ids": [1]}', r"t.jsonl:1: field 'output_length'"),
    ('{"timestamp": 0, "input_length": 10, "output_length": 4, "hash_ids": ["a"]}', r"t.jsonl:1: field 'hash_ids'"),
    ('{"timestamp": 0, "input_length": 10, "output_length": 4, "hash_ids": [1], "x": 1}', r"t.jsonl:1: unknown field 'x'"),
    ('{"timestamp": 0, "input_length": 10', r"t.jsonl:1: malformed JSON"),
])
def test_bad_trace_lines_name_file_line_and_field(tmp_path, line, msg):
    p = tmp_path / "t.jsonl"
    p.write_text(line + "\n")
    with pytest.raises(UserError, match=msg):
        load_trace(p, TraceConfig())


def test_bailian_layout_reads_seconds_and_16_token_blocks(tmp_path):
    p = tmp_path / "b.jsonl"
    p.write_text('{"chat_id": 1, "parent_chat_id": -1, "timestamp": 2.5, "input_length": 20, "output_length": 3, '
                 '"type": "text", "turn": 1, "hash_ids": [7, 8]}\n'
                 '{"chat_id": 2, "parent_chat_id": 1, "timestamp": 4.0, "input_length": 40, "output_length": 3, '
                 '"type": "text", "turn": 2, "hash_ids": [7, 8, 9]}\n')
    rows = load_trace(p, TraceConfig(layout="bailian"))
    assert [r.arrival_s for r in rows] == [0.0, 1.5]
    assert rows[1].prompt_token_ids[:20] == rows[0].prompt_token_ids and len(rows[1].prompt_token_ids) == 40


@pytest.mark.parametrize("extra, msg", [
    ({"parent": 0}, r"d.jsonl:1: field 'parent': 0 is not an earlier row"),
    ({"turn": -1}, r"d.jsonl:1: field 'turn': expected an integer >= 0"),
    ({"think_time_s": None}, r"d.jsonl:1: field 'think_time_s': expected a number >= 0, got None"),
    ({"arrival_s": "soon"}, r"d.jsonl:1: field 'arrival_s': expected a number >= 0"),
])
def test_bad_session_fields_in_jsonl_name_file_line_and_field(tmp_path, extra, msg):
    p = tmp_path / "d.jsonl"
    p.write_text(json.dumps({"prompt_token_ids": [1, 2], "output_len": 2, **extra}) + "\n")
    with pytest.raises(UserError, match=msg):
        load_jsonl(p)
