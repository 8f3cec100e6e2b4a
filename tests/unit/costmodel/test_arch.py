"""prefixstudy.costmodel.arch: parameter counts and KV bytes worked out by hand; bad config.json fields."""

from __future__ import annotations

import pytest

from prefixstudy.errors import UserError
from prefixstudy.costmodel.arch import arch_from_config


def test_mistral_params_and_kv(mistral):
    # attention/layer: 2*4096*4096 + 2*4096*1024 = 33,554,432 + 8,388,608 = 41,943,040
    assert mistral.attn_params_per_layer == 41_943_040
    # MLP/layer: 3*4096*14336 = 176,160,768
    assert mistral.mlp_params_per_layer == 176_160_768
    # 32 * 218,103,808
    assert mistral.matmul_params == 6_979_321_856
    # embed + lm_head, untied: 2 * 32768*4096
    assert mistral.embedding_params == 268_435_456
    # (2*32 + 1) * 4096
    assert mistral.norm_params == 266_240
    assert mistral.bias_params == 0
    # 6,979,321,856 + 268,435,456 + 266,240
    assert mistral.total_params == 7_248_023_552
    assert mistral.total_params == pytest.approx(7.25e9, rel=1e-3)
    # 32 layers * 8 kv heads * 128 * 2 (K,V) * 2 bytes
    assert mistral.kv_bytes_per_token(2) == 131_072


def test_qwen2_biases_tied_and_default_head_dim():
    # Qwen2-0.5B's config.json fields; its published parameter count is 494,032,768.
    cfg = {"model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864,
           "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
           "vocab_size": 151936, "tie_word_embeddings": True}
    a = arch_from_config(cfg)
    assert a.head_dim == 64  # 896 / 14
    # q,k,v biases: (896 + 2*128) * 24
    assert a.bias_params == 27_648
    # one 151936 x 896 matrix (tied)
    assert a.embedding_params == 136_134_656
    # 24 * (1,835,008 + 13,074,432) + 136,134,656 + 27,648 + 49*896
    assert a.total_params == 494_032_768


@pytest.mark.parametrize("cfg, field", [
    ({"model_type": "gpt2"}, "model_type"),
    ({"model_type": "llama", "hidden_size": 64}, "num_attention_heads"),
    ({"model_type": "llama", "hidden_size": "64"}, "hidden_size"),
    ({"model_type": "mistral", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 3},
     "num_key_value_heads"),
])
def test_bad_config_fields(cfg, field):
    with pytest.raises(UserError, match=f"field '{field}'"):
        arch_from_config(cfg, "x/config.json")
