"""What the model is: parameter counts and KV bytes per token of a dense decoder.

Reads a Hugging Face ``config.json`` (Llama, Mistral or Qwen2) into an ``Arch``; a
missing or bad field is a ``UserError`` naming it, and so is a field that marks what the
arithmetic does not cover (mixture of experts, latent attention, sliding windows, other layer
kinds, quantized weights).  Pure arithmetic, no GPU.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prefixstudy.errors import UserError, read_text

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")
# Fields that mark an architecture the arithmetic does not cover (a true value of any refuses it).
UNCOVERED = (
    ("num_local_experts", "mixture-of-experts"), ("num_experts", "mixture-of-experts"),
    ("n_routed_experts", "mixture-of-experts"), ("moe_intermediate_size", "mixture-of-experts"),
    ("kv_lora_rank", "multi-head latent attention (MLA)"), ("q_lora_rank", "multi-head latent attention (MLA)"),
    ("quantization_config", "a quantized checkpoint"),
)
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4}


@dataclass(frozen=True)
class Arch:
    """A dense decoder (Llama / Mistral / Qwen2): GQA attention, SwiGLU MLP."""

    name: str
    model_type: str
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied_embeddings: bool = False
    qkv_bias: bool = False  # Qwen2: counted as parameters, ignored in FLOPs
    mlp_bias: bool = False

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def attn_params_per_layer(self) -> int:
        """q, k, v and o projection weights."""
        return 2 * self.hidden * self.q_dim + 2 * self.hidden * self.kv_dim

    @property
    def mlp_params_per_layer(self) -> int:
        """gate, up and down projection weights (SwiGLU)."""
        return 3 * self.hidden * self.intermediate

    @property
    def matmul_params(self) -> int:
        """Weights of the decoder layers' projections; lm_head is counted apart."""
        return self.layers * (self.attn_params_per_layer + self.mlp_params_per_layer)

    @property
    def lm_head_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def embedding_params(self) -> int:
        """Input embedding + lm_head (one matrix when tied)."""
        return self.lm_head_params * (1 if self.tied_embeddings else 2)

    @property
    def bias_params(self) -> int:
        per_layer = (self.q_dim + 2 * self.kv_dim) if self.qkv_bias else 0
        per_layer += (2 * self.intermediate + self.hidden) if self.mlp_bias else 0
        return self.layers * per_layer

    @property
    def norm_params(self) -> int:
        return (2 * self.layers + 1) * self.hidden  # two RMSNorms per layer + the final one

    @property
    def total_params(self) -> int:
        return self.matmul_params + self.embedding_params + self.bias_params + self.norm_params

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        return self.layers * self.kv_heads * self.head_dim * 2 * dtype_bytes  # 2: K and V


def arch_from_config(cfg: dict[str, Any], source: str = "config.json") -> Arch:
    """Read the fields the arithmetic needs; a missing or bad one is a UserError naming it."""
    if not isinstance(cfg, dict):
        raise UserError(f"{source}: expected a JSON object, got {type(cfg).__name__}")
    model_type = cfg.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise UserError(f"{source}: field 'model_type' is {model_type!r}; "
                        f"supported dense decoders: {', '.join(SUPPORTED_MODEL_TYPES)}")
    for key, what in UNCOVERED:
        if cfg.get(key):
            raise UserError(f"{source}: field '{key}': {what} is not covered (the roofline and the simulator "
                            f"assume a dense decoder with full attention and bf16 weights)")
    if cfg.get("sliding_window") and cfg.get("use_sliding_window", True) is not False:
        raise UserError(f"{source}: field 'sliding_window': sliding-window attention is not covered (the roofline "
                        f"and the simulator assume full attention)")
    kinds = set(cfg.get("layer_types") or ()) - {"full_attention"}
    if kinds:
        raise UserError(f"{source}: field 'layer_types': {', '.join(sorted(map(str, kinds)))} layers are not "
                        f"covered (the roofline and the simulator assume full attention)")

    def pos_int(key: str, default: Any = None) -> int:
        v = cfg.get(key, default)
        if v is None:
            raise UserError(f"{source}: field '{key}' is missing")
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise UserError(f"{source}: field '{key}' must be a positive integer, got {v!r}")
        return v

    hidden = pos_int("hidden_size")
    heads = pos_int("num_attention_heads")
    kv_heads = pos_int("num_key_value_heads", heads)  # absent: plain multi-head attention
    if heads % kv_heads:
        raise UserError(f"{source}: field 'num_key_value_heads' ({kv_heads}) must divide "
                        f"num_attention_heads ({heads})")
    if cfg.get("head_dim") is not None:
        head_dim = pos_int("head_dim")
    elif hidden % heads:
        raise UserError(f"{source}: field 'head_dim' is missing and hidden_size {hidden} "
                        f"is not a multiple of num_attention_heads {heads}")
    else:
        head_dim = hidden // heads
    return Arch(
        name=str(cfg.get("_name_or_path") or (cfg.get("architectures") or [model_type])[0]),
        model_type=model_type,
        hidden=hidden,
        intermediate=pos_int("intermediate_size"),
        layers=pos_int("num_hidden_layers"),
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        vocab=pos_int("vocab_size"),
        tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        qkv_bias=bool(cfg.get("attention_bias", model_type == "qwen2")),
        mlp_bias=bool(cfg.get("mlp_bias", False)),
    )


def load_config_json(path: str | Path) -> dict[str, Any]:
    """A config.json file, or a folder holding one."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    text = read_text(path, "config.json", "a config.json file")
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise UserError(f"{path}: line {e.lineno}: invalid JSON: {e.msg}") from None
    except RecursionError:
        raise UserError(f"{path}: invalid JSON: nested too deep") from None


def load_arch(path: str | Path) -> Arch:
    path = Path(path)
    source = str(path / "config.json" if path.is_dir() else path)
    return arch_from_config(load_config_json(path), source)
