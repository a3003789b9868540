"""The architecture of each (size, family): transformers config classes, so config.json is theirs."""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import torch
from transformers import GenerationConfig, LlamaConfig, PretrainedConfig, Qwen2Config, Qwen3Config

FAMILIES = ("llama", "qwen2", "qwen3")
MAX_POSITION_EMBEDDINGS = 2048


@dataclass(frozen=True)
class SizeSpec:
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    vocab_size: int
    # Qwen3 states head_dim explicitly; making heads * head_dim differ from hidden_size (as in
    # real Qwen3 checkpoints) catches code that derives head_dim as hidden_size // num_heads.
    qwen3_num_attention_heads: int
    qwen3_head_dim: int
    # The parameter count `make_model` promises for this size, tied or untied, any family.
    min_params: int
    max_params: int


SIZES = MappingProxyType(
    {
        "tiny": SizeSpec(
            hidden_size=256,
            num_hidden_layers=8,
            num_attention_heads=8,
            num_key_value_heads=4,
            intermediate_size=1024,
            vocab_size=4096,
            qwen3_num_attention_heads=8,
            qwen3_head_dim=64,
            min_params=5_000_000,
            max_params=15_000_000,
        ),
        "small": SizeSpec(
            hidden_size=768,
            num_hidden_layers=12,
            num_attention_heads=12,
            num_key_value_heads=4,
            intermediate_size=2048,
            vocab_size=16384,
            qwen3_num_attention_heads=8,
            qwen3_head_dim=128,
            min_params=60_000_000,
            max_params=120_000_000,
        ),
    }
)


@dataclass(frozen=True)
class SpecialTokenIds:
    bos_token_id: int
    eos_token_id: int
    pad_token_id: int
    # Generation stops at any of these: the end of a chat turn or of a document.
    stop_token_ids: tuple[int, ...]


def size_spec(size: str) -> SizeSpec:
    if size not in SIZES:
        raise ValueError(f"size must be one of {sorted(SIZES)}, got {size!r}")
    return SIZES[size]


def build_config(
    size: str, family: str, *, tie_word_embeddings: bool, token_ids: SpecialTokenIds
) -> PretrainedConfig:
    """The transformers config for one checkpoint, with float32 as its declared dtype."""
    spec = size_spec(size)
    common: dict[str, Any] = {
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_hidden_layers,
        "num_key_value_heads": spec.num_key_value_heads,
        "max_position_embeddings": MAX_POSITION_EMBEDDINGS,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": tie_word_embeddings,
        "bos_token_id": token_ids.bos_token_id,
        "eos_token_id": token_ids.eos_token_id,
        "pad_token_id": token_ids.pad_token_id,
        "dtype": torch.float32,
    }
    config: PretrainedConfig
    if family == "llama":
        # llama3 scaling with a short original context, so the scaled frequencies matter at
        # positions a test reaches (the wavelength cut-offs fall inside 256 tokens).
        config = LlamaConfig(
            num_attention_heads=spec.num_attention_heads,
            rope_parameters={
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 256,
            },
            architectures=["LlamaForCausalLM"],
            **common,
        )
    elif family == "qwen2":
        config = Qwen2Config(
            num_attention_heads=spec.num_attention_heads,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
            architectures=["Qwen2ForCausalLM"],
            **common,
        )
    elif family == "qwen3":
        config = Qwen3Config(
            num_attention_heads=spec.qwen3_num_attention_heads,
            head_dim=spec.qwen3_head_dim,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
            architectures=["Qwen3ForCausalLM"],
            **common,
        )
    else:
        raise ValueError(f"family must be one of {list(FAMILIES)}, got {family!r}")
    return config


def build_generation_config(token_ids: SpecialTokenIds) -> GenerationConfig:
    # Greedy by default: a test oracle should give the same answer to the same prompt.
    return GenerationConfig(
        bos_token_id=token_ids.bos_token_id,
        eos_token_id=list(token_ids.stop_token_ids),
        pad_token_id=token_ids.pad_token_id,
        do_sample=False,
    )
