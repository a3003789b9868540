"""Read a Hugging Face config.json (transformers 4.x and 5.x spellings) into a typed config.

transformers 5.x writes `dtype` and `rope_parameters` where 4.x wrote `torch_dtype` and
`rope_theta` / `rope_scaling`; both forms are accepted.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


@dataclass(frozen=True)
class RopeConfig:
    theta: float
    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int | None = None


@dataclass(frozen=True)
class ModelConfig:
    family: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    rope: RopeConfig
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool
    tie_word_embeddings: bool
    torch_dtype: str | None
    eos_token_ids: tuple[int, ...]
    sliding_window: int | None

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim


def _rope_config(raw: dict[str, Any]) -> RopeConfig:
    params = raw.get("rope_parameters") or {}
    scaling = raw.get("rope_scaling") or {}
    merged = {**scaling, **params}
    theta = merged.get("rope_theta", raw.get("rope_theta", 10000.0))
    rope_type = merged.get("rope_type", merged.get("type", "default")) or "default"
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(
            f"rope_type {rope_type!r} is not supported (supported: {SUPPORTED_ROPE_TYPES})"
        )
    return RopeConfig(
        theta=float(theta),
        rope_type=rope_type,
        factor=float(merged.get("factor", 1.0)),
        low_freq_factor=float(merged.get("low_freq_factor", 1.0)),
        high_freq_factor=float(merged.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=merged.get("original_max_position_embeddings"),
    )


def _eos_ids(raw: dict[str, Any], generation: dict[str, Any]) -> tuple[int, ...]:
    value = generation.get("eos_token_id", raw.get("eos_token_id"))
    if value is None:
        return ()
    return tuple(value) if isinstance(value, list) else (int(value),)


def parse_model_config(
    raw: dict[str, Any], generation: dict[str, Any] | None = None
) -> ModelConfig:
    architectures = raw.get("architectures") or []
    family = next(
        (SUPPORTED_ARCHITECTURES[a] for a in architectures if a in SUPPORTED_ARCHITECTURES), None
    )
    if family is None:
        raise ValueError(
            f"architectures {architectures} not supported (supported: {sorted(SUPPORTED_ARCHITECTURES)})"
        )
    num_heads = int(raw["num_attention_heads"])
    hidden = int(raw["hidden_size"])
    head_dim = raw.get("head_dim") or hidden // num_heads
    attention_bias = bool(raw.get("attention_bias", False))
    use_sliding = raw.get("use_sliding_window", family == "mistral")
    return ModelConfig(
        family=family,
        vocab_size=int(raw["vocab_size"]),
        hidden_size=hidden,
        intermediate_size=int(raw["intermediate_size"]),
        num_layers=int(raw["num_hidden_layers"]),
        num_heads=num_heads,
        num_kv_heads=int(raw.get("num_key_value_heads") or num_heads),
        head_dim=int(head_dim),
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
        rope=_rope_config(raw),
        # Qwen2 always has q/k/v biases; Llama and Qwen3 follow `attention_bias` (o too for Llama).
        qkv_bias=family == "qwen2" or attention_bias,
        o_bias=family in ("llama", "mistral") and attention_bias,
        mlp_bias=bool(raw.get("mlp_bias", False)),
        qk_norm=family == "qwen3",
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        torch_dtype=raw.get("dtype", raw.get("torch_dtype")),
        eos_token_ids=_eos_ids(raw, generation or {}),
        sliding_window=raw.get("sliding_window") if use_sliding else None,
    )


def load_model_config(model_dir: str | Path) -> ModelConfig:
    path = Path(model_dir)
    config_path = path / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"{config_path} not found: not a Hugging Face checkpoint directory")
    raw = json.loads(config_path.read_text())
    generation_path = path / "generation_config.json"
    generation = json.loads(generation_path.read_text()) if generation_path.is_file() else {}
    return parse_model_config(raw, generation)
