"""LoRA on the model's projections by composition: a wrapper holds the base nn.Linear and adds,
per token, the delta of that token's adapter slot.

A wrapper covers one base linear and the sub-projections fused into it, in output order, e.g.
qkv_proj = (q_proj, k_proj, v_proj) with widths (q_size, kv_size, kv_size). For each
sub-projection it holds one stack per slot, zero beyond the adapter's rank (or all zero when
the slot's adapter does not target it):

    lora_a[i]  [max_loras, max_rank, in_features]
    lora_b[i]  [max_loras, out_i, max_rank]          (PEFT scale folded in at load)

Every wrapper of a model shares one LoRAStepContext; the model runner puts the step's LoRABatch
on it for the forward pass. No batch (no token uses an adapter): the base layer alone runs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from kernels.ops import lora_expand, lora_shrink
from lora.batch import LoRABatch
from lora.dims import BaseModelDims
from lora.loader import LoadedAdapter


class LoRAStepContext:
    """Per-step LoRA state shared by every wrapper of one model (set by the runner)."""

    def __init__(self) -> None:
        self.batch: LoRABatch | None = None


@dataclass(frozen=True)
class SubProjection:
    module: str  # PEFT short name, e.g. "k_proj"
    offset: int  # first output column inside the fused output
    width: int


class LoRALinear(nn.Module):
    def __init__(
        self,
        base: nn.Linear,
        subs: Sequence[SubProjection],
        *,
        max_loras: int,
        max_rank: int,
        context: LoRAStepContext,
    ):
        super().__init__()
        self.base = base
        self.subs = tuple(subs)
        self.context = context
        in_features = base.in_features
        weight = base.weight
        self.lora_a = [
            torch.zeros(max_loras, max_rank, in_features, dtype=weight.dtype, device=weight.device)
            for _ in self.subs
        ]  # per sub-projection: [max_loras, max_rank, in_features]
        self.lora_b = [
            torch.zeros(max_loras, s.width, max_rank, dtype=weight.dtype, device=weight.device)
            for s in self.subs
        ]  # per sub-projection: [max_loras, width, max_rank]
        # slot -> does its adapter target sub-projection i (host side, so a batch whose
        # adapters all skip a sub-projection launches nothing for it)
        self.targets = [[False] * max_loras for _ in self.subs]

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [num_tokens, in_features]
        out = self.base(x)  # [num_tokens, out_features]
        batch = self.context.batch
        if batch is None:
            return out
        for part in batch.parts:
            x_part = x[part.rows]
            out_part = out[part.rows]
            for i, sub in enumerate(self.subs):
                targets = self.targets[i]
                if not any(targets[s] for s in part.meta.active_slots):
                    continue
                y = lora_shrink(x_part, self.lora_a[i], part.meta, form=part.form)  # [n, max_rank]
                columns = out_part[:, sub.offset : sub.offset + sub.width]
                lora_expand(y, self.lora_b[i], part.meta, columns, form=part.form)
        return out

    def set_slot(self, slot: int, layer: int, adapter: LoadedAdapter | None) -> None:
        """Write (or clear) one slot's weights for every sub-projection of this wrapper."""
        for i, sub in enumerate(self.subs):
            weights = None if adapter is None else adapter.modules.get((layer, sub.module))
            a_slot, b_slot = self.lora_a[i][slot], self.lora_b[i][slot]
            if weights is None:
                a_slot.zero_()
                b_slot.zero_()
                self.targets[i][slot] = False
                continue
            rank = weights.rank
            non_blocking = weights.lora_a.is_pinned()
            a_slot[:rank].copy_(weights.lora_a, non_blocking=non_blocking)  # [rank, in]
            a_slot[rank:].zero_()
            b_slot[:, :rank].copy_(weights.lora_b, non_blocking=non_blocking)  # [width, rank]
            b_slot[:, rank:].zero_()
            self.targets[i][slot] = True


def _sub_projections(modules: Sequence[str], dims: BaseModelDims) -> list[SubProjection]:
    subs, offset = [], 0
    for module in modules:
        width = dims.in_out(module)[1]
        subs.append(SubProjection(module, offset, width))
        offset += width
    return subs


class LoRALayers:
    """Every LoRA wrapper of one model, by decoder layer; fills and clears slots."""

    def __init__(
        self,
        decoder_layers: Iterable[nn.Module],
        layout: Mapping[str, tuple[str, ...]],
        dims: BaseModelDims,
        *,
        max_loras: int,
        max_rank: int,
    ):
        """`layout` maps a projection's attribute path inside a decoder layer to the PEFT
        modules fused into it, in output order (e.g. "self_attn.qkv_proj" -> q, k, v)."""
        self.context = LoRAStepContext()
        self.max_loras = max_loras
        self.max_rank = max_rank
        self.wrappers: list[tuple[int, LoRALinear]] = []
        for layer_index, layer in enumerate(decoder_layers):
            for path, modules in layout.items():
                parent_path, _, attr = path.rpartition(".")
                parent = layer.get_submodule(parent_path) if parent_path else layer
                base = getattr(parent, attr)
                if not isinstance(base, nn.Linear):
                    raise TypeError(f"{path} of layer {layer_index} is not an nn.Linear")
                subs = _sub_projections(modules, dims)
                if subs[-1].offset + subs[-1].width != base.out_features:
                    raise ValueError(f"{path}: fused widths do not add up to out_features")
                wrapper = LoRALinear(
                    base, subs, max_loras=max_loras, max_rank=max_rank, context=self.context
                )
                setattr(parent, attr, wrapper)
                self.wrappers.append((layer_index, wrapper))

    def set_slot(self, slot: int, adapter: LoadedAdapter | None) -> None:
        if adapter is not None and adapter.rank > self.max_rank:
            raise ValueError(f"adapter rank {adapter.rank} exceeds max_lora_rank {self.max_rank}")
        for layer_index, wrapper in self.wrappers:
            wrapper.set_slot(slot, layer_index, adapter)
