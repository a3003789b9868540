"""Triton LoRA shrink (segmented and gathered forms). Work in progress: use kernels.ops."""

from __future__ import annotations

import torch

from kernels.lora_meta import LoRAKernelMeta


def lora_shrink_triton(
    x: torch.Tensor, lora_a: torch.Tensor, meta: LoRAKernelMeta, *, form: str
) -> torch.Tensor:
    """``out[t] = x[t] @ lora_a[slot[t], :rank[slot[t]]].T``; not implemented yet."""
    raise NotImplementedError("Triton lora_shrink is not implemented yet")
