"""The matmul kernel's FMA path (kernels/cpu/native/fma_tile.h: AVX2, bf16 weights widened to float32,
and every float32 matmul), what an AVX2-only CPU runs; on an AVX-512 CPU a build without
AVX-512 checks it. float32 within float32 sums' error of the float64 products, bf16 within a
bf16 step; tiles of 6 rows, slabs of 256 inputs, work items stolen between threads, one row by
whole blocks: each the same bits as the plain path where the sums' order is the same."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kernels.cpu.matmul import SOURCE, NativeMatmul, packed_size
from kernels.cpu.native.build import build
from tests.kernels.cpu.matmul_cases import (
    KERNEL,
    at_thread_counts,
    case,
    float32_case,
    fused_silu_against_separate,
    needs_fma,
    within_a_bf16_step,
)


@needs_fma
@pytest.mark.parametrize("rows", [1, 5, 6, 7, 13, 96, 97, 200])
@pytest.mark.parametrize("n, k", [(64, 2), (1280, 768), (100, 64), (768, 600), (130, 96)])
@pytest.mark.parametrize("bias", [False, True])
def test_float32_matches_the_float64_products(rows: int, n: int, k: int, bias: bool) -> None:
    """float32 sums of float32 products (slabs of 256 inputs: k = 600 takes a short last slab)."""
    x, w, b, exact = float32_case(rows, n, k, bias, seed=rows)
    y = KERNEL(x, KERNEL.pack(w), n, b)
    assert y.shape == (rows, n) and y.dtype is torch.float32
    # a sum of k products in float32: each partial sum rounds by 2^-24 relative
    torch.testing.assert_close(y.double(), exact, rtol=1e-5, atol=k * 2e-7)
    torch.testing.assert_close(y, torch.nn.functional.linear(x, w, b), rtol=1e-5, atol=k * 2e-7)


@needs_fma
def test_the_float32_layout_holds_panels_of_16_and_unpacks() -> None:
    n, k = 100, 6
    w = torch.randn(n, k)
    packed = KERNEL.pack(w)
    assert packed.dtype is torch.float32 and packed.numel() == packed_size(n, k)
    # block 0, panel 0: input after input, each input's 16 outputs side by side
    assert torch.equal(packed[: k * 16].view(k, 16), w[:16].T)
    assert torch.equal(packed[k * 16 : k * 32].view(k, 16), w[16:32].T)
    # the last block's panels past output 100 are zero
    last = packed[64 * k :].view(4, k, 16)
    assert torch.equal(last[2, :, :4], w[96:].T)
    assert not last[2, :, 4:].any() and not last[3].any()
    assert torch.equal(KERNEL.unpack(packed, n, k), w)


@needs_fma
@pytest.mark.parametrize("rows", [1, 4, 5, 6, 81, 200])
def test_the_fma_path_in_bf16(rows: int, tmp_path: Path) -> None:
    """bf16 weights widened to float32 as they are read (what an AVX2-only CPU runs; on this CPU
    too where it has AVX512-BF16, by a build without AVX-512): within a bf16 step of the exact
    products, equal to F.linear almost everywhere, the weight packed as column tiles of 16."""
    fma = NativeMatmul(build(tmp_path, source=SOURCE, extra_flags=("-mno-avx512f",)))
    assert fma.available and fma.f32_available and not fma.amx and fma.tiled(8)
    x, w, b, exact = case(rows, 320, 768, bias=True, seed=rows)
    packed = fma.pack(w)
    assert torch.equal(fma.unpack(packed, 320, 768), w)
    assert torch.equal(packed[: 768 * 16].view(384, 16, 2), w[:16].view(16, 384, 2).transpose(0, 1))
    y = fma(x, packed, 320, b)
    within_a_bf16_step(y, exact)
    assert (y == torch.nn.functional.linear(x, w, b)).float().mean().item() > 0.98


@needs_fma
@pytest.mark.parametrize("silu", [False, True])
def test_the_fma_path_widens_a_slab_once_for_many_rows_with_the_same_bits(
    silu: bool, tmp_path: Path
) -> None:
    """On the FMA path a work item of four or more row tiles widens each bf16 panel slab to
    float32 once and runs the float32 loop over it; fewer rows widen the weights as they read
    them. The products and their order are the same: so are the bits, row by row."""
    fma = NativeMatmul(build(tmp_path, source=SOURCE, extra_flags=("-mno-avx512f",)))
    x, w, b, _ = case(100, 320, 768, bias=True, seed=7)
    packed = fma.pack(w)

    def run(rows: torch.Tensor) -> torch.Tensor:
        return fma.silu(rows, packed, 160, b) if silu else fma(rows, packed, 320, b)

    whole = run(x)  # 96 + 4 rows: the first item widens (16 tiles), the second does not
    for r in range(0, 100, 6):  # one tile each: widened as read
        assert torch.equal(run(x[r : r + 6]), whole[r : r + 6]), r


@needs_fma
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("rows", [8, 100, 300])
def test_the_fma_path_gives_the_same_bits_at_any_thread_count(
    dtype: torch.dtype, rows: int, tmp_path: Path
) -> None:
    """On the FMA path each thread takes a run of work items (a block, up to 96 rows) and, done
    with it, items from the back of another's; a block's later chunks ask for nothing ahead, the
    last asks for the next block. Any split (more threads than items included) computes every
    output once, in the same order: the same bits at 1, 2, 3, 7 and 64 threads."""
    fma = NativeMatmul(build(tmp_path, source=SOURCE, extra_flags=("-mno-avx512f",)))
    n, k = 1280, 600  # 20 blocks; 300 rows: 4 chunks, the last one short
    if dtype is torch.bfloat16:
        x, w, b, exact = case(rows, n, k, bias=True, seed=rows)
    else:
        x, w, b, exact = float32_case(rows, n, k, bias=True, seed=rows)
    packed = fma.pack(w)
    outs = at_thread_counts(lambda: fma(x, packed, n, b))
    if dtype is torch.bfloat16:
        within_a_bf16_step(outs[1], exact)
    else:
        torch.testing.assert_close(outs[1].double(), exact, rtol=1e-5, atol=k * 2e-7)
    for threads, y in outs.items():
        assert torch.equal(y, outs[1]), threads


@needs_fma
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("silu", [False, True])
def test_the_fma_path_takes_one_row_by_whole_blocks_with_the_same_bits(
    dtype: torch.dtype, silu: bool, tmp_path: Path
) -> None:
    """A single row (a decode step of one sequence) runs a block's four panels at once over
    the whole input (fma_row_panels) instead of a panel and a slab at a time (k = 600: a short
    last slab there). Each output's products are summed in the same order: a row alone equals
    that row of a 5-row call bit for bit, with and without the fused SiLU; a wrong panel, input
    or order fails it. float32 weights take the same path on every FMA CPU."""
    fma = NativeMatmul(build(tmp_path, source=SOURCE, extra_flags=("-mno-avx512f",)))
    n, k = 320, 600
    if dtype is torch.bfloat16:
        x, w, b, exact = case(5, n, k, bias=True, seed=11)
    else:
        x, w, b, exact = float32_case(5, n, k, bias=True, seed=11)
    packed = fma.pack(w)

    def run(rows: torch.Tensor) -> torch.Tensor:
        return fma.silu(rows, packed, n // 2, b) if silu else fma(rows, packed, n, b)

    whole = run(x)
    if not silu and dtype is torch.bfloat16:
        within_a_bf16_step(whole, exact)
    for r in range(5):
        assert torch.equal(run(x[r : r + 1]), whole[r : r + 1]), r


@needs_fma
@pytest.mark.parametrize("rows", [1, 6, 13, 100])
@pytest.mark.parametrize("bias", [False, True])
def test_the_fused_silu_in_float32(rows: int, bias: bool) -> None:
    """silu(gate) * up in the same pass equals the matmul then kernels/cpu/native/layer.cpp's
    silu_mul, bit for bit."""
    width = 96
    x, w, b, _ = float32_case(rows, 2 * width, 64, bias, seed=rows)
    fused, separate, _, _ = fused_silu_against_separate(x, w, b, width)
    assert torch.equal(fused, separate)
