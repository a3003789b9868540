"""Decode-only steps of the base model in one native call (kernels/cpu_decoder.py), where every
part of the eager step already runs native.

The eager model (engine/models/llama.py) stays the reference and runs every other step. A step
goes native only where the eager step would have run exactly these kernels: the fused layer
ops on, decode attention "native", every projection in the matmul kernel's layout for the
step's rows (engine/native_matmul.py decides that at start-up) with the gate/up projection
fused with its SiLU, no query/key norm (Qwen3's), and no adapter in the batch (the caller
checks that). Then the values equal the eager step's bit for bit (tests/engine/
test_native_decoder.py); what changes is ~100 Python-side kernel calls a step become one.
"""

from __future__ import annotations

from typing import cast

import torch
from torch import nn

from engine.models.llama import DecoderLayer as ModelLayer
from engine.models.llama import LlamaForCausalLM
from engine.packed_linear import PackedLinear
from kernels.cpu_attention import native_paged_decode
from kernels.cpu_decoder import (
    DecoderLayer,
    DecoderModel,
    NativeDecoder,
    PackedWeight,
    decoder_library,
)
from kernels.cpu_layer import NativeLayer
from kernels.cpu_native import NativeBuildError

KVCaches = list[tuple[torch.Tensor, torch.Tensor]]


class NativeDecodeStep:
    """The decoder and the largest step (rows) every projection's kernel takes."""

    def __init__(self, decoder: NativeDecoder, max_rows: int, embed: nn.Embedding):
        self.decoder = decoder
        self.max_rows = max_rows
        self.embed = embed

    def takes(self, rows: int) -> bool:
        return 0 < rows <= self.max_rows

    def forward(
        self,
        input_ids: torch.Tensor,  # [rows]
        positions: torch.Tensor,  # [rows] int64
        slots: torch.Tensor,  # [rows] int64
        tables: torch.Tensor,  # [rows, max_blocks] int64
        lengths: torch.Tensor,  # [rows] int64, this token included
    ) -> torch.Tensor:  # [rows, hidden] after the final norm, as the eager model returns it
        embeddings = self.embed(input_ids).contiguous()
        return self.decoder.forward(embeddings, positions, slots, tables, lengths)


def build_native_decode_step(
    model: LlamaForCausalLM,
    kv_caches: KVCaches,
    *,
    block_size: int,
    native_layer: NativeLayer | None,
    decode_backend: str,
) -> tuple[NativeDecodeStep | None, str]:
    """The native step for this model as it is now set up, or None and why not."""
    reason = _unsupported(model, native_layer, decode_backend)
    if reason is not None:
        return None, reason
    assert native_layer is not None
    c = model.config
    layers = []
    max_rows = torch.iinfo(torch.int64).max
    model_layers = cast(list[ModelLayer], list(model.layers))
    for layer, (k_cache, v_cache) in zip(model_layers, kv_caches, strict=True):
        attn, mlp = layer.self_attn, layer.mlp
        weights = []
        for proj in (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj):
            packed = _packed(proj)
            if packed is None or packed.native is None:
                return None, "a projection is not in the matmul kernel's layout"
            max_rows = min(max_rows, packed.native_rows)
            weights.append(
                PackedWeight(
                    packed.native[1], packed.native_bias, packed.out_features, packed.in_features
                )
            )
        gate_up = _packed(mlp.gate_up_proj)
        if gate_up is None or gate_up.gate_up_width is None:
            return None, "the gate/up projection is not fused with its SiLU"
        qkv, o, gate_up_weight, down = weights
        norms = (
            layer.input_layernorm.weight.detach(),
            layer.post_attention_layernorm.weight.detach(),
        )
        layers.append(DecoderLayer(*norms, qkv, o, gate_up_weight, down, k_cache, v_cache))
    try:
        library = decoder_library()
    except NativeBuildError as exc:
        return None, f"the decoder library did not build ({exc})"
    kernel = _packed(model_layers[0].mlp.down_proj)
    assert kernel is not None and kernel.native is not None
    decoder = NativeDecoder(
        library,
        DecoderModel(
            layers=tuple(layers),
            final_norm=model.norm.weight.detach(),
            cos_table=model.rotary.cos,
            sin_table=model.rotary.sin,
            num_heads=c.num_heads,
            kv_heads=c.num_kv_heads,
            head_dim=c.head_dim,
            intermediate=c.intermediate_size,
            block_size=block_size,
            eps=c.rms_norm_eps,
            scale=model_layers[0].self_attn.scale,
        ),
        matmul_library=kernel.native[0].library,
        layer_library=native_layer.library,
        attention_library=native_paged_decode().library,
    )
    return NativeDecodeStep(decoder, max_rows, model.embed_tokens), "on"


def _unsupported(
    model: LlamaForCausalLM, native_layer: NativeLayer | None, decode_backend: str
) -> str | None:
    c = model.config
    dtype = model.norm.weight.dtype
    if native_layer is None:
        return "the fused layer kernels are off"
    if decode_backend != "native":
        return f"decode attention is {decode_backend!r}, not 'native'"
    if dtype not in (torch.bfloat16, torch.float32) or model.norm.weight.device.type != "cpu":
        return f"{dtype} on {model.norm.weight.device.type}"
    if c.qk_norm:
        return "the model normalises queries and keys (not in the native step)"
    if model.rotary.cos.device.type != "cpu":
        return "the rotary tables are not on the CPU"
    return None


def _packed(proj: nn.Module) -> PackedLinear | None:
    """The PackedLinear under a projection (an adapter wrapper keeps it as `base`)."""
    base = getattr(proj, "base", proj)
    return base if isinstance(base, PackedLinear) else None
