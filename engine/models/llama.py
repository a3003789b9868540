"""The Llama family (Llama 2/3, Mistral, Qwen2/2.5, Qwen3) over a paged KV cache.

q/k/v and gate/up are fused into one matmul each (the loader concatenates the checkpoint's
weights); Qwen2 adds q/k/v biases, Qwen3 adds per-head RMSNorm on q and k before RoPE.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

import torch
import torch.nn.functional as F
from torch import nn

from engine.attention import AttentionMetadata, paged_attention
from engine.models.hf_config import ModelConfig
from engine.models.rope import RotaryEmbedding, apply_rotary
from engine.paged_decode import DecodeMetadata

# Where LoRA wrappers go (lora/layers.py): each fused projection's attribute path inside a
# DecoderLayer -> the PEFT modules fused into it, in output order.
LORA_PROJECTIONS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "self_attn.qkv_proj": ("q_proj", "k_proj", "v_proj"),
        "self_attn.o_proj": ("o_proj",),
        "mlp.gate_up_proj": ("gate_proj", "up_proj"),
        "mlp.down_proj": ("down_proj",),
    }
)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in float32 and cast back before the weight, as transformers does; the fused
        # op is ~20x faster on CPU than the pow/mean/rsqrt chain and gives the same values.
        normed = F.rms_norm(x.to(torch.float32), (x.shape[-1],), eps=self.eps)
        return self.weight * normed.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, layer_index: int):
        super().__init__()
        self.config = config
        self.layer_index = layer_index
        self.qkv_proj = nn.Linear(
            config.hidden_size, config.q_size + 2 * config.kv_size, bias=config.qkv_bias
        )
        self.o_proj = nn.Linear(config.q_size, config.hidden_size, bias=config.o_bias)
        self.q_norm = RMSNorm(config.head_dim, config.rms_norm_eps) if config.qk_norm else None
        self.k_norm = RMSNorm(config.head_dim, config.rms_norm_eps) if config.qk_norm else None
        self.scale = config.head_dim**-0.5

    def forward(
        self,
        hidden: torch.Tensor,  # [num_tokens, hidden]
        cos_sin: tuple[torch.Tensor, torch.Tensor],
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        meta: AttentionMetadata | DecodeMetadata,
    ) -> torch.Tensor:
        c = self.config
        num_tokens = hidden.shape[0]
        qkv = self.qkv_proj(hidden)  # [num_tokens, q_size + 2 * kv_size]
        q, k, v = qkv.split([c.q_size, c.kv_size, c.kv_size], dim=-1)
        q = q.reshape(num_tokens, c.num_heads, c.head_dim)
        k = k.reshape(num_tokens, c.num_kv_heads, c.head_dim)
        v = v.reshape(num_tokens, c.num_kv_heads, c.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rotary(q, k, cos_sin)
        out = paged_attention(q, k, v, kv_cache[0], kv_cache[1], meta, self.scale)
        return self.o_proj(out.reshape(num_tokens, c.q_size))


class MLP(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.intermediate = config.intermediate_size
        self.gate_up_proj = nn.Linear(
            config.hidden_size, 2 * config.intermediate_size, bias=config.mlp_bias
        )
        self.down_proj = nn.Linear(
            config.intermediate_size, config.hidden_size, bias=config.mlp_bias
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).split(self.intermediate, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_index: int):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, layer_index)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(
        self,
        hidden: torch.Tensor,
        cos_sin: tuple[torch.Tensor, torch.Tensor],
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        meta: AttentionMetadata | DecodeMetadata,
    ) -> torch.Tensor:
        hidden = hidden + self.self_attn(self.input_layernorm(hidden), cos_sin, kv_cache, meta)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class LlamaForCausalLM(nn.Module):
    def __init__(self, config: ModelConfig, rotary: RotaryEmbedding):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.rotary = rotary

    def forward(
        self,
        input_ids: torch.Tensor,  # [num_tokens]
        positions: torch.Tensor,  # [num_tokens]
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        meta: AttentionMetadata | DecodeMetadata,
    ) -> torch.Tensor:  # [num_tokens, hidden] after the final norm
        hidden = self.embed_tokens(input_ids)
        cos_sin = self.rotary.lookup(positions, hidden.dtype)
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            hidden = layer(hidden, cos_sin, kv_cache, meta)
        return self.norm(hidden)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)  # [num_selected, vocab]
