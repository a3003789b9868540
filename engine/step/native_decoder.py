"""Decode steps, and steps with prefill chunks, in one native call (kernels/cpu/decoder.py),
where every part of the eager step already runs native.

The eager model (engine/models/llama.py) stays the reference and runs every other step. A step
goes native only where the eager step would have run exactly these kernels: the fused layer
ops on, decode attention "native", every projection in the matmul kernel's layout for the
step's rows (engine/step/native_matmul.py decides that at start-up) with the gate/up projection
fused with its SiLU, no query/key norm (Qwen3's), and, for a step with adapters, their deltas
computed by the LoRA runs kernel (bf16 on AVX512-BF16: what lora_add_cpu runs eager there);
a step with prefill chunks, where their attention is the prefill kernel's (the runner's
prefill kernel is set) and no row has an adapter. Then the values equal the eager step's bit
for bit (tests/engine/step/test_native_decoder.py); what changes is ~100 Python-side kernel calls a
step become one (in a prefill step of the mixed workload, ~5 ms of Python a step:
bench/history/RESULTS-2026-11.md, session 30).
"""

from __future__ import annotations

from typing import cast

import torch
from torch import nn

from engine.models.llama import DecoderLayer as ModelLayer
from engine.models.llama import LlamaForCausalLM
from engine.step.packed_linear import PackedLinear
from kernels.cpu.attention import native_paged_decode
from kernels.cpu.decoder import (
    MAX_FUSED,
    DecoderLayer,
    DecoderModel,
    LoraStacks,
    LoraStep,
    NativeDecoder,
    PackedWeight,
    PrefillStep,
    decoder_library,
)
from kernels.cpu.layer import NativeLayer
from kernels.cpu.matmul import NativeMatmul
from kernels.cpu.native.build import NativeBuildError
from kernels.cpu.prefill import NativePrefill
from kernels.cpu.rows import MAX_FUSED_RANK, NativeRows
from lora.batch import LoRABatch
from lora.layers import LoRALinear, LoRAStepContext

KVCaches = list[tuple[torch.Tensor, torch.Tensor]]


class NativeDecodeStep:
    """The decoder, the largest step (rows) every projection's kernel takes, and each layer's
    adapter wrappers (qkv, o, gate_up, down; None where the model has none) where adapter steps
    run here too (`takes_lora`)."""

    def __init__(
        self,
        decoder: NativeDecoder,
        max_rows: int,
        embed: nn.Embedding,
        wrappers: list[tuple[LoRALinear | None, ...]] | None = None,
    ):
        self.decoder = decoder
        self.max_rows = max_rows
        self.embed = embed
        self.wrappers = wrappers
        self.takes_lora = wrappers is not None and decoder.takes_lora

    def takes(self, rows: int) -> bool:
        return 0 < rows <= self.max_rows

    def forward(
        self,
        input_ids: torch.Tensor,  # [rows]
        positions: torch.Tensor,  # [rows] int64
        slots: torch.Tensor,  # [rows] int64
        tables: torch.Tensor,  # [rows, max_blocks] int64
        lengths: torch.Tensor,  # [rows] int64, this token included
        lora: LoRABatch | None = None,
    ) -> torch.Tensor:  # [rows, hidden] after the final norm, as the eager model returns it
        embeddings = self.embed(input_ids).contiguous()
        step = None if lora is None else self._lora_step(lora, input_ids.shape[0])
        return self.decoder.forward(embeddings, positions, slots, tables, lengths, step)

    @property
    def takes_prefill(self) -> bool:
        return self.decoder.takes_prefill

    def forward_prefill(
        self,
        input_ids: torch.Tensor,  # [rows]: the decode rows', then the chunks'
        positions: torch.Tensor,  # [rows] int64
        slots: torch.Tensor,  # [rows] int64
        tables: torch.Tensor,  # [decodes, max_blocks] int64 (decodes may be 0)
        lengths: torch.Tensor,  # [decodes] int64
        prefill: PrefillStep,
    ) -> torch.Tensor:  # [rows or kept rows, hidden] after the final norm
        """A step with prefill chunks (no adapters): the eager model's values, bit for bit."""
        embeddings = self.embed(input_ids).contiguous()
        return self.decoder.forward(embeddings, positions, slots, tables, lengths, prefill=prefill)

    def _lora_step(self, batch: LoRABatch, rows: int) -> LoraStep:
        """The batch as the decoder takes it; a projection adds deltas where the eager
        LoRALinear would (some row's adapter targets it)."""
        if not self.takes_lora or self.wrappers is None:
            raise ValueError("this native step was built without adapter steps")
        (part,) = batch.parts  # on the CPU one part covers the whole batch (lora/batch.py)
        if part.rows != slice(0, rows):
            raise ValueError(f"the adapter part covers rows {part.rows}, not the step's {rows}")
        meta = part.metas[0]
        assert meta.cpu is not None
        active = meta.active_slots
        on = [
            [w is not None and any(w.targets[s] for s in active) for w in layer]
            for layer in self.wrappers
        ]
        return LoraStep(
            segments=meta.cpu.segments,
            slot_ranks=tuple(m.slot_ranks for m in part.metas),
            rank=meta.max_rank,
            on=torch.tensor(on, dtype=torch.uint8),
        )


def build_native_decode_step(
    model: LlamaForCausalLM,
    kv_caches: KVCaches,
    *,
    block_size: int,
    native_layer: NativeLayer | None,
    decode_backend: str,
    lora: LoRAStepContext | None = None,
    prefill_kernel: NativePrefill | None = None,
) -> tuple[NativeDecodeStep | None, str]:
    """The native step for this model as it is now set up, or None and why not. `lora`: the
    adapter wrappers' shared context, where the model has them: adapter steps run here too
    where the eager step would add their deltas by the runs kernel. `prefill_kernel`: the
    prefill attention the eager step runs (None: steps with prefill chunks stay eager)."""
    reason = _unsupported(model, native_layer, decode_backend)
    if reason is not None:
        return None, reason
    assert native_layer is not None
    c = model.config
    layers = []
    wrappers: list[tuple[LoRALinear | None, ...]] = []
    max_rows = torch.iinfo(torch.int64).max
    kernel: NativeMatmul | None = None  # the matmul kernel every projection is laid out for
    model_layers = cast(list[ModelLayer], list(model.layers))
    for layer, (k_cache, v_cache) in zip(model_layers, kv_caches, strict=True):
        attn, mlp = layer.self_attn, layer.mlp
        projections = (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)
        packed = [_packed(proj) for proj in projections]
        weights = []
        for linear in packed:
            if linear is None or linear.native is None:
                return None, "a projection is not in the matmul kernel's layout"
            max_rows = min(max_rows, linear.native_rows)
            weights.append(
                PackedWeight(
                    linear.native[1], linear.native_bias, linear.out_features, linear.in_features
                )
            )
            kernel = linear.native[0]
        if cast(PackedLinear, packed[2]).gate_up_width is None:  # each checked just above
            return None, "the gate/up projection is not fused with its SiLU"
        qkv, o, gate_up_weight, down = weights
        norms = (
            layer.input_layernorm.weight.detach(),
            layer.post_attention_layernorm.weight.detach(),
        )
        stacks = tuple(_stacks(proj) for proj in projections)
        wrappers.append(tuple(p if isinstance(p, LoRALinear) else None for p in projections))
        layers.append(
            DecoderLayer(*norms, qkv, o, gate_up_weight, down, k_cache, v_cache, lora=stacks)
        )
    assert kernel is not None  # the model has layers, each with projections
    runs, why = _lora_runs(lora, model.norm.weight.dtype, layers)
    try:
        library = decoder_library()
    except NativeBuildError as exc:
        return None, f"the decoder library did not build ({exc})"
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
        matmul_library=kernel.library,
        layer_library=native_layer.library,
        attention_library=native_paged_decode().library,
        rows_library=None if runs is None else runs.library,
        prefill_library=None if prefill_kernel is None else prefill_kernel.library,
    )
    step = NativeDecodeStep(decoder, max_rows, model.embed_tokens, wrappers if runs else None)
    return step, "on" if step.takes_lora or lora is None else f"on, adapter steps eager ({why})"


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


def _stacks(proj: nn.Module) -> LoraStacks | None:
    if not isinstance(proj, LoRALinear):
        return None
    subs = torch.tensor(proj.sub_outputs, dtype=torch.int64).reshape(-1)
    return LoraStacks(proj.lora_a, proj.lora_b.transpose(1, 2), subs)


def _lora_runs(
    lora: LoRAStepContext | None, dtype: torch.dtype, layers: list[DecoderLayer]
) -> tuple[NativeRows | None, str]:
    """The runs kernel where every adapter step's deltas would go through it eager too
    (lora_add_cpu's run_segments: bf16 on AVX512-BF16 or AVX2 + FMA, the C kernel, plain
    stacks), else None and why."""
    if lora is None:
        return None, "no adapters"
    kernel = lora.cpu_gathered
    if not isinstance(kernel, NativeRows) or not kernel.runs_bf16 or dtype is not torch.bfloat16:
        return None, "the adapters' deltas are not computed by the bf16 runs kernel"
    for layer in layers:
        for stacks in layer.lora:
            if stacks is None:
                continue
            if (
                stacks.subs.numel() // 2 > MAX_FUSED
                or stacks.a.shape[1] > MAX_FUSED_RANK
                or not (stacks.a.is_contiguous() and stacks.b_rows.is_contiguous())
            ):
                return None, "an adapter stack the runs kernel does not take"
    return kernel, "on"
