"""Linear layers with their weights pre-packed into oneDNN's blocked layout (CPU only).

`F.linear` on a plain [out, in] bf16 weight re-reads the weight in a layout oneDNN's kernels do
not want: on the 2-core AVX512-BF16 EPYC (no AMX) the small model's 49 projections at batch 1
ran at 13 GB/s of a 27 GB/s memory bus. Reordered once at load (what inductor's freezing pass
does for compiled CPU graphs), the same matmuls ran 1.3x faster at batch 1 and 1.35x at batch
64, 1.1x at 512 tokens (prefill). Values equal F.linear's to bf16 rounding (both accumulate in
float32).

float32 depends on the CPU: F.linear goes to MKL, which on that AVX512 EPYC was as fast as
oneDNN's packed form, while on an AVX2-only EPYC MKL ran the small model's projections 1.25x
slower at batch 1, 2.6x at batch 4 and 1.3x at batch 64 (bench/RESULTS.md, session 9). So
float32 is packed where a start-up timing of the model's own largest projection says it pays
(`packing_pays`); values then differ from F.linear's by float32 summation order only.

The packed module replaces the nn.Linear in place (also the base layer inside a LoRA wrapper),
so the plain weight is dropped and memory does not double.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from engine.timing import best_time
from kernels.cpu_gemv import NativeGemv

# The kernel takes up to 4 rows, but only 1 and 2 were clearly faster than oneDNN everywhere
# measured (2 threads: 1.09-1.16x and 1.25-1.55x; at 4 rows 0.95-1.24x, and 0.84x on one
# thread: bench/RESULTS.md, session 11), so 3 rows and more stay on oneDNN.
GEMV_ROWS = 2


def can_pack(dtype: torch.dtype, device: torch.device) -> bool:
    if device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    if dtype is torch.bfloat16:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return dtype is torch.float32


# The timed problem: decode-sized inputs (a step's rows), a few repeats, best of.
_TIMED_ROWS, _REPEATS = (1, 4, 32), 5
# float32 is packed only when that is clearly faster: a tie keeps the reference path.
_MIN_GAIN = 1.1


def packing_pays(model: nn.Module, dtype: torch.dtype) -> tuple[bool, str]:
    """Whether packing speeds this model's matmuls up on this machine, and the figures. bf16
    (where oneDNN has it) always does; float32 is timed on the model's largest projection."""
    if dtype is not torch.float32:
        return True, f"{dtype}: always packed"
    linears = [m for m in model.modules() if type(m) is nn.Linear]
    if not linears:
        return False, "no linear layers"
    largest = max(linears, key=lambda m: m.weight.numel())
    weight = largest.weight.detach()
    packed = torch.ops.mkldnn._reorder_linear_weight(weight, None)
    plain_s = packed_s = 0.0
    for rows in _TIMED_ROWS:
        x = torch.randn(rows, largest.in_features, dtype=dtype)
        plain_s += _best_of(F.linear, x, weight)
        packed_s += _best_of(torch.ops.mkldnn._linear_pointwise, x, packed, None, "none", [], "")
    pays = plain_s > _MIN_GAIN * packed_s
    shape = f"{largest.out_features}x{largest.in_features}"
    return (
        pays,
        f"float32 {shape} at {_TIMED_ROWS} rows: plain {plain_s * 1e3:.2f} ms, packed {packed_s * 1e3:.2f} ms",
    )


def _best_of(op: Callable[..., object], *args: object) -> float:
    return best_time(lambda: op(*args), _REPEATS)


class PackedLinear(nn.Module):
    """y = x W^T + b with W held in oneDNN's packed layout (opaque: no `.weight`); with
    `use_gemv`, inputs of 1-2 rows (GEMV_ROWS) go to the hand-written kernel over its own copy of W
    (engine/decode_gemv.py decides where that pays)."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        # No batch-size hint: one packing serves decode (a few rows) and prefill (thousands).
        packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), None)
        self.register_buffer("packed_weight", packed, persistent=False)
        self.packed_weight: torch.Tensor
        bias = None if linear.bias is None else linear.bias.detach()
        self.register_buffer("bias", bias, persistent=False)
        self.bias: torch.Tensor | None
        # The small-row kernel and its copy of the weight in its layout (use_gemv), or None.
        self.gemv: tuple[NativeGemv, torch.Tensor] | None = None

    def use_gemv(self, kernel: NativeGemv | None) -> None:
        """Run 1-2 rows by `kernel` over a copy of the weight in its layout (None: drop it)."""
        if kernel is not None and self.bias is not None and self.bias.dtype is not torch.bfloat16:
            raise ValueError(f"gemv adds a bf16 bias, this layer's is {self.bias.dtype}")
        self.gemv = None if kernel is None else (kernel, kernel.pack(self.weight()))

    def weight(self) -> torch.Tensor:
        """The plain [out, in] weight, unpacked (a copy)."""
        return self.packed_weight.to_dense()

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [num_tokens, in_features]
        if self.gemv is not None and 0 < x.shape[0] <= GEMV_ROWS:
            kernel, weight = self.gemv
            return kernel(x, weight, self.out_features, self.bias)
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
