"""PyTorch reference of the LoRA kernels; also the CPU path of ``kernels.ops``.

Grouped per adapter: one matmul pair per active slot over that slot's tokens, never a loop over
tokens. The segmented and gathered forms differ only in how a kernel finds a token's slot, so the
reference serves both.
"""

from __future__ import annotations

import torch

from kernels.lora_meta import LoRAKernelMeta


def _rows_of(meta: LoRAKernelMeta, slot: int) -> torch.Tensor | None:
    """Indices of the tokens using ``slot``; None when every token does (a plain slice is cheaper)."""
    rows = (meta.token_slots == slot).nonzero().squeeze(1)  # [num_rows] int64
    return None if rows.numel() == meta.num_tokens else rows


def lora_shrink_ref(x: torch.Tensor, lora_a: torch.Tensor, meta: LoRAKernelMeta) -> torch.Tensor:
    """``out[t] = x[t] @ lora_a[slot[t], :rank[slot[t]]].T``, zero beyond the rank and for slot -1.

    x: [num_tokens, in_features], any float dtype.
    lora_a: [num_slots, max_rank, in_features], any float dtype.
    Returns [num_tokens, max_rank] float32 (products accumulated in float32).
    """
    out = torch.zeros(meta.num_tokens, meta.max_rank, dtype=torch.float32, device=x.device)
    for slot in meta.active_slots:
        rank = int(meta.slot_ranks[slot])
        if rank == 0:
            continue
        a = lora_a[slot, :rank].float()  # [rank, in_features]
        rows = _rows_of(meta, slot)
        if rows is None:
            out[:, :rank] = x.float() @ a.T
        else:
            out[rows, :rank] = x[rows].float() @ a.T
    return out


def lora_expand_ref(
    y: torch.Tensor, lora_b: torch.Tensor, meta: LoRAKernelMeta, out: torch.Tensor
) -> None:
    """``out[t] += (y[t, :rank] @ lora_b[slot[t], :, :rank].T).to(out.dtype)``; slot -1 untouched.

    y: [num_tokens, max_rank] float32 (the shrink output).
    lora_b: [num_slots, out_features, max_rank], any float dtype, scale already folded in.
    out: [num_tokens, out_features], any float dtype, updated in place; may be a strided view
    (a column slice of a fused projection output).
    """
    for slot in meta.active_slots:
        rank = int(meta.slot_ranks[slot])
        if rank == 0:
            continue
        b = lora_b[slot, :, :rank].float()  # [out_features, rank]
        rows = _rows_of(meta, slot)
        if rows is None:
            out += (y[:, :rank].float() @ b.T).to(out.dtype)
        else:
            delta = y[rows, :rank].float() @ b.T  # [num_rows, out_features] float32
            out.index_add_(0, rows, delta.to(out.dtype))
