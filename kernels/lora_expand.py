"""Triton LoRA expand (segmented and gathered forms). Work in progress: use kernels.ops."""

from __future__ import annotations

import torch

from kernels.lora_meta import LoRAKernelMeta


def lora_expand_triton(
    y: torch.Tensor, lora_b: torch.Tensor, meta: LoRAKernelMeta, out: torch.Tensor, *, form: str
) -> None:
    """``out[t] += (y[t, :rank] @ lora_b[slot[t], :, :rank].T).to(out.dtype)``; not implemented yet."""
    raise NotImplementedError("Triton lora_expand is not implemented yet")
