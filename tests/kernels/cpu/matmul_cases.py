"""What the matmul kernel's tests share (tests/kernels/cpu/test_cpu_matmul.py, the vdpbf16ps and
AMX paths; tests/kernels/cpu/test_cpu_matmul_fma.py, the AVX2 FMA path): the built kernel, the
skips by CPU, bf16 and float32 cases with their float64 products, and the bf16 tolerance."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from kernels.cpu.layer import native_layer
from kernels.cpu.matmul import interleave_gate_up, native_matmul

KERNEL = native_matmul()
needs_bf16_dot = pytest.mark.skipif(
    not KERNEL.available,
    reason="this CPU has neither AVX512-BF16 nor AVX2 + FMA: the kernel is built without them",
)
needs_fma = pytest.mark.skipif(
    not KERNEL.f32_available, reason="this CPU has no AVX2 + FMA: no float32 path is built"
)


def case(rows: int, n: int, k: int, bias: bool, seed: int = 0):  # type: ignore[no-untyped-def]
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=gen).bfloat16()
    w = (torch.randn(n, k, generator=gen) * k**-0.5).bfloat16()
    b = torch.randn(n, generator=gen).bfloat16() if bias else None
    exact = x.double() @ w.double().T + (0 if b is None else b.double())
    return x, w, b, exact


def within_a_bf16_step(y: torch.Tensor, exact: torch.Tensor) -> None:
    # float32 sums in another order, then one rounding: at most a step of bf16 (2^-8 relative)
    # beyond the rounding of the exact value itself
    assert y.dtype is torch.bfloat16
    torch.testing.assert_close(y.double(), exact, rtol=2**-7, atol=1e-3)


def at_thread_counts(run: Callable[[], torch.Tensor]) -> dict[int, torch.Tensor]:
    """`run()` at 1, 2, 3, 7 and 64 threads (more than the items of some calls)."""
    before = torch.get_num_threads()
    outs = {}
    try:
        for threads in (1, 2, 3, 7, 64):
            torch.set_num_threads(threads)
            outs[threads] = run()
    finally:
        torch.set_num_threads(before)
    return outs


def float32_case(rows: int, n: int, k: int, bias: bool, seed: int = 0):  # type: ignore[no-untyped-def]
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=gen)
    w = torch.randn(n, k, generator=gen) * k**-0.5
    b = torch.randn(n, generator=gen) if bias else None
    exact = x.double() @ w.double().T + (0 if b is None else b.double())
    return x, w, b, exact


def fused_silu_against_separate(
    x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, width: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The fused gate/up + SiLU pass on the interleaved weight, the separate matmul then
    kernels/cpu/native/layer.cpp's silu_mul, and the interleaved packed weight and bias used."""
    separate = native_layer().silu_mul(KERNEL(x, KERNEL.pack(w), 2 * width, b))
    packed = KERNEL.pack(interleave_gate_up(w, width))
    b_mixed = None if b is None else interleave_gate_up(b, width).contiguous()
    return KERNEL.silu(x, packed, width, b_mixed), separate, packed, b_mixed
