"""The Llama family (Llama 2/3, Mistral, Qwen2/2.5, Qwen3) over a paged KV cache.

q/k/v and gate/up are fused into one matmul each (the loader concatenates the checkpoint's
weights); Qwen2 adds q/k/v biases, Qwen3 adds per-head RMSNorm on q and k before RoPE.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

import torch
from torch import nn

from engine.models.hf_config import ModelConfig
from engine.models.layer_ops import LayerOps, RotaryInputs
from engine.models.rope import RotaryEmbedding
from engine.step.attention import AttentionMetadata, attend_paged
from engine.step.paged_decode import DecodeMetadata
from kernels.cpu.layer import NativeLayer

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


@dataclass(frozen=True)
class KeptRows:
    """The rows of a step whose final hidden state is read (its sampling rows). The last layer
    writes every row's K/V and attends for every row, then runs its output projection, MLP and
    the final norm on these rows alone: no later layer reads the others (llama.cpp prunes its
    last layer the same way). In a prefill-heavy step that skips ~7% of the layers' products."""

    rows: torch.Tensor  # [num_kept] long, increasing
    # Called once the step moves to the kept rows (the LoRA wrappers switch to their batch).
    on_prune: Callable[[], None] | None = None

    def select(self, x: torch.Tensor) -> torch.Tensor:  # [num_tokens, ...] -> [num_kept, ...]
        return x.index_select(0, self.rows)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, ops: LayerOps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        self.ops = ops

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """With `residual`: `residual += x` in place, and the sum normalised."""
        return self.ops.rms_norm(x, self.weight, self.eps, residual)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, layer_index: int, ops: LayerOps):
        super().__init__()
        self.config = config
        self.layer_index = layer_index
        self.ops = ops
        self.qkv_proj = nn.Linear(
            config.hidden_size, config.q_size + 2 * config.kv_size, bias=config.qkv_bias
        )
        self.o_proj = nn.Linear(config.q_size, config.hidden_size, bias=config.o_bias)
        self.q_norm = RMSNorm(config.head_dim, config.rms_norm_eps, ops) if config.qk_norm else None
        self.k_norm = RMSNorm(config.head_dim, config.rms_norm_eps, ops) if config.qk_norm else None
        self.scale = config.head_dim**-0.5

    def forward(
        self,
        hidden: torch.Tensor,  # [num_tokens, hidden]
        rotary: RotaryInputs,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        meta: AttentionMetadata | DecodeMetadata,
        keep: KeptRows | None = None,
    ) -> torch.Tensor:  # [num_tokens or num_kept, hidden]
        c = self.config
        num_tokens = hidden.shape[0]
        qkv = self.qkv_proj(hidden)  # [num_tokens, q_size + 2 * kv_size]
        q, k, v = qkv.split([c.q_size, c.kv_size, c.kv_size], dim=-1)
        q = q.reshape(num_tokens, c.num_heads, c.head_dim)
        k = k.reshape(num_tokens, c.num_kv_heads, c.head_dim)
        v = v.reshape(num_tokens, c.num_kv_heads, c.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self.ops.rope_and_cache(q, k, v, rotary, kv_cache, meta.slot_mapping)
        out = attend_paged(q, k, v, kv_cache[0], kv_cache[1], meta, self.scale)
        out = out.reshape(num_tokens, c.q_size)
        if keep is not None:
            out = keep.select(out)
            if keep.on_prune is not None:
                keep.on_prune()
        return self.o_proj(out)


class MLP(nn.Module):
    def __init__(self, config: ModelConfig, ops: LayerOps):
        super().__init__()
        self.intermediate = config.intermediate_size
        self.ops = ops
        self.gate_up_proj = nn.Linear(
            config.hidden_size, 2 * config.intermediate_size, bias=config.mlp_bias
        )
        self.down_proj = nn.Linear(
            config.intermediate_size, config.hidden_size, bias=config.mlp_bias
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.ops.gate_up_silu(self.gate_up_proj, x, self.intermediate))


class DecoderLayer(nn.Module):
    """The residual stream travels beside the layer's output, as vLLM's layers carry it: each
    norm first adds the previous block's output into it (one fused step with the norm). The
    values are the textbook `h + attn(norm(h))`, `h + mlp(norm(h))`."""

    def __init__(self, config: ModelConfig, layer_index: int, ops: LayerOps):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, ops)
        self.self_attn = Attention(config, layer_index, ops)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, ops)
        self.mlp = MLP(config, ops)

    def forward(
        self,
        hidden: torch.Tensor,  # [num_tokens, hidden]: the previous layer's MLP output
        residual: torch.Tensor,  # [num_tokens, hidden]: the stream before it, updated in place
        rotary: RotaryInputs,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
        meta: AttentionMetadata | DecodeMetadata,
        keep: KeptRows | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """This layer's MLP output and the stream before it (`residual`, updated in place;
        with `keep`, both hold the kept rows alone)."""
        normed = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(normed, rotary, kv_cache, meta, keep)
        if keep is not None:
            residual = keep.select(residual)
        return self.mlp(self.post_attention_layernorm(hidden, residual)), residual


class LlamaForCausalLM(nn.Module):
    def __init__(self, config: ModelConfig, rotary: RotaryEmbedding):
        super().__init__()
        self.config = config
        # shared by every module; use_layer_ops swaps what it runs
        self.layer_ops = LayerOps()
        ops = self.layer_ops
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, i, ops) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, ops)
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
        keep: KeptRows | None = None,
    ) -> torch.Tensor:  # [num_tokens, hidden] after the final norm; with `keep`, [num_kept, hidden]
        # the first layer's norm adds its `hidden` (zeros) into the embeddings: exact
        residual = self.embed_tokens(input_ids)
        hidden = torch.zeros_like(residual)
        rotary = RotaryInputs(self.rotary, positions, residual.dtype)
        last = len(self.layers) - 1
        for i, (layer, kv_cache) in enumerate(zip(self.layers, kv_caches, strict=True)):
            hidden, residual = layer(
                hidden, residual, rotary, kv_cache, meta, keep if i == last else None
            )
        return self.norm(hidden, residual)

    def use_layer_ops(self, native: NativeLayer | None) -> None:
        """Run the layers' element-wise steps by the fused CPU kernels (None: PyTorch's)."""
        self.layer_ops.native = native

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)  # [num_selected, vocab]
