"""Linear layers with their weights pre-packed into oneDNN's blocked layout (CPU only).

`F.linear` on a plain [out, in] bf16 weight re-reads the weight in a layout oneDNN's kernels do
not want: on the 2-core AVX512-BF16 EPYC (no AMX) the small model's 49 projections at batch 1
ran at 13 GB/s of a 27 GB/s memory bus. Reordered once at load (what inductor's freezing pass
does for compiled CPU graphs), the same matmuls ran 1.3x faster at batch 1 and 1.35x at batch
64, 1.1x at 512 tokens (prefill). Values equal F.linear's to bf16 rounding (both accumulate in
float32).

float32 depends on the CPU: F.linear goes to MKL, which on that AVX512 EPYC was as fast as
oneDNN's packed form, while on an AVX2-only EPYC MKL ran the small model's projections 1.25x
slower at batch 1, 2.6x at batch 4 and 1.3x at batch 64 (bench/history/RESULTS-2026-11.md, session 9). So
float32 is packed where a start-up timing of the model's own largest projection says it pays
(`packing_pays`, timed once per machine and model where the engine keeps a tuning file:
engine/step/choices/tuning.py); values then differ from F.linear's by float32 summation order only.

The packed module replaces the nn.Linear in place (also the base layer inside a LoRA wrapper),
so the plain weight is dropped and memory does not double.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from engine.step.choices.timing import best_times
from kernels.cpu import onednn
from kernels.cpu.matmul import (
    NativeMatmul,
    deinterleave_gate_up,
    deinterleave_outputs,
    interleave_gate_up,
)


def can_pack(dtype: torch.dtype, device: torch.device) -> bool:
    if device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    if dtype is torch.bfloat16:
        return onednn.has_bf16()
    return dtype is torch.float32


# The timed problem: decode-sized inputs (a step's rows), best of several interleaved repeats.
_TIMED_ROWS, _REPEATS = (1, 4, 32), 9
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
        plain = functools.partial(F.linear, x, weight)
        pointwise = torch.ops.mkldnn._linear_pointwise
        timings = best_times(
            {
                "plain": plain,
                "packed": functools.partial(pointwise, x, packed, None, "none", [], ""),
            },
            _REPEATS,
        )
        plain_s, packed_s = plain_s + timings["plain"], packed_s + timings["packed"]
    pays = plain_s > _MIN_GAIN * packed_s
    shape = f"{largest.out_features}x{largest.in_features}"
    return (
        pays,
        f"float32 {shape} at {_TIMED_ROWS} rows: plain {plain_s * 1e3:.2f} ms, packed {packed_s * 1e3:.2f} ms",
    )


class PackedLinear(nn.Module):
    """y = x W^T + b with W held in oneDNN's packed layout (opaque: no `.weight`) and/or in the
    hand-written kernel's (`use_native`: inputs of up to `native_rows` rows go to the kernel;
    with no limit oneDNN's copy is dropped). engine/step/native_matmul.py decides where that pays.

    `onednn` False (a CPU whose oneDNN has no kernels for the dtype, bf16 on AVX2): the
    reference copy is the plain weight, multiplied by F.linear."""

    def __init__(self, linear: nn.Linear, *, onednn: bool = True):
        super().__init__()
        self.onednn = onednn
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.dtype = linear.weight.dtype
        # No batch-size hint: one packing serves decode (a few rows) and prefill (thousands).
        # None once the kernel takes every row.
        self.register_buffer(
            "packed_weight", self._onednn(linear.weight.detach()), persistent=False
        )
        self.packed_weight: torch.Tensor | None
        bias = None if linear.bias is None else linear.bias.detach()
        self.register_buffer("bias", bias, persistent=False)
        self.bias: torch.Tensor | None
        # The kernel and its copy of the weight in its layout (use_native), or None.
        self.native: tuple[NativeMatmul, torch.Tensor] | None = None
        self.native_rows = 0
        # A fused gate/up projection whose SiLU the kernel applies (`silu_forward`): its width,
        # the copy's rows interleaved for it (kernels/cpu/matmul.py), and the bias likewise.
        self.gate_up_width: int | None = None
        self.native_bias: torch.Tensor | None = None

    def _onednn(self, weight: torch.Tensor) -> torch.Tensor:
        if not self.onednn:
            return weight.contiguous()
        return torch.ops.mkldnn._reorder_linear_weight(weight, None)

    def use_native(
        self,
        kernel: NativeMatmul | None,
        max_rows: int | None = None,
        gate_up_width: int | None = None,
    ) -> None:
        """Run inputs of up to `max_rows` rows by `kernel` over a copy of the weight in its
        layout; `max_rows` None: every input, and oneDNN's copy is dropped. `gate_up_width`:
        this is a fused [gate | up] projection of that width, whose kernel copy is laid out so
        `silu_forward` can apply the SiLU in the same pass (oneDNN's copy, where it stays, is
        the plain weight). `kernel` None: back to oneDNN alone."""
        if kernel is not None and self.bias is not None and self.bias.dtype is not self.dtype:
            raise ValueError(
                f"the matmul kernel adds a bias of the weight's dtype ({self.dtype}), this "
                f"layer's is {self.bias.dtype}"
            )
        if gate_up_width is not None and kernel is None:
            raise ValueError("a gate/up layout is the kernel's: it needs the kernel")
        # oneDNN's copy first (from the kernel's, in its current layout) where it is to stay
        if (kernel is None or max_rows is not None) and self.packed_weight is None:
            self.packed_weight = self._onednn(self.weight())
        if kernel is None:
            self.native, self.native_rows = None, 0
            self.gate_up_width, self.native_bias = None, self.bias
            return
        # the kernel's copy is packed again only when the kernel or its layout changes
        # (start-up timing installs it once, then the choice keeps it)
        if (
            self.native is None
            or self.native[0] is not kernel
            or self.gate_up_width != gate_up_width
        ):
            weight, self.native_bias = self.weight(), self.bias
            if gate_up_width is not None:
                weight = interleave_gate_up(weight, gate_up_width)
                if self.bias is not None:
                    self.native_bias = interleave_gate_up(self.bias, gate_up_width).contiguous()
            self.native, self.gate_up_width = (kernel, kernel.pack(weight)), gate_up_width
        self.native_rows = torch.iinfo(torch.int64).max if max_rows is None else max_rows
        if max_rows is None:
            self.packed_weight = None

    def weight(self) -> torch.Tensor:
        """The plain [out, in] weight, unpacked (a copy)."""
        if self.packed_weight is not None:
            return self.packed_weight.to_dense() if self.onednn else self.packed_weight.clone()
        assert self.native is not None
        weight = self.native[0].unpack(self.native[1], self.out_features, self.in_features)
        if self.gate_up_width is not None:
            return deinterleave_gate_up(weight, self.gate_up_width)
        return weight.clone()

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [num_tokens, in_features]
        if self.native is not None and x.shape[0] <= self.native_rows:
            kernel, weight = self.native
            y = kernel(x, weight, self.out_features, self.native_bias)
            if self.gate_up_width is not None:
                return deinterleave_outputs(y, self.gate_up_width)
            return y
        return self.reference(x)

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        """oneDNN's matmul (or F.linear's) over the reference copy, whatever the kernel does."""
        assert self.packed_weight is not None
        if not self.onednn:
            return F.linear(x, self.packed_weight, self.bias)
        return torch.ops.mkldnn._linear_pointwise(
            x.contiguous(), self.packed_weight, self.bias, "none", [], ""
        )

    def silu_forward(self, x: torch.Tensor) -> torch.Tensor | None:
        """silu(gate) * up of this fused projection in one pass (its rounding: as the separate
        matmul and SiLU), or None where it is not laid out for that or x has more rows than
        the kernel takes (use the two steps)."""
        if self.gate_up_width is None or x.shape[0] > self.native_rows:
            return None
        assert self.native is not None
        kernel, weight = self.native
        return kernel.silu(x, weight, self.gate_up_width, self.native_bias)

    def extra_repr(self) -> str:
        form = "packed"
        if self.native is not None:
            form = (
                "native" if self.packed_weight is None else f"native up to {self.native_rows} rows"
            )
        return f"in_features={self.in_features}, out_features={self.out_features}, {form}"


def pack_linears(model: nn.Module, *, onednn: bool = True) -> int:
    """Replace every nn.Linear under `model` by a PackedLinear; returns how many."""
    targets = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if type(child) is nn.Linear
    ]
    for parent, name, child in targets:
        setattr(parent, name, PackedLinear(child, onednn=onednn))
    return len(targets)
