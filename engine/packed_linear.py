"""bfloat16 linear layers with their weights pre-packed into oneDNN's blocked layout (CPU only).

`F.linear` on a plain [out, in] bf16 weight re-reads the weight in a layout oneDNN's kernels do
not want: on the 2-core AVX512-BF16 EPYC (no AMX) the small model's 49 projections at batch 1
ran at 13 GB/s of a 27 GB/s memory bus. Reordered once at load (what inductor's freezing pass
does for compiled CPU graphs), the same matmuls ran 1.3x faster at batch 1 and 1.35x at batch
64, 1.1x at 512 tokens (prefill). float32 gains nothing from MKL's packed form here, so only
bf16 is packed. Values equal F.linear's to bf16 rounding (both accumulate in float32).

The packed module replaces the nn.Linear in place (also the base layer inside a LoRA wrapper),
so the plain weight is dropped and memory does not double.
"""

from __future__ import annotations

import torch
from torch import nn


def can_pack(dtype: torch.dtype, device: torch.device) -> bool:
    return (
        device.type == "cpu"
        and dtype is torch.bfloat16
        and torch.backends.mkldnn.is_available()
        and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    )


class PackedLinear(nn.Module):
    """y = x W^T + b with W held in oneDNN's packed layout (opaque: no `.weight`)."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        # No batch-size hint: one packing serves decode (a few rows) and prefill (thousands).
        packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), None)
        self.register_buffer("packed_weight", packed, persistent=False)
        bias = None if linear.bias is None else linear.bias.detach()
        self.register_buffer("bias", bias, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [num_tokens, in_features]
        return torch.ops.mkldnn._linear_pointwise(
            x.contiguous(), self.packed_weight, self.bias, "none", [], ""
        )

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, packed"


def pack_linears(model: nn.Module) -> int:
    """Replace every nn.Linear under `model` by a PackedLinear; returns how many."""
    targets = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if type(child) is nn.Linear
    ]
    for parent, name, child in targets:
        setattr(parent, name, PackedLinear(child))
    return len(targets)
