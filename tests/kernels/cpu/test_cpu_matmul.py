"""The matmul kernel (kernels/cpu/native/matmul.cpp) against float64 products of the same values: in
bf16, float32 sums and one rounding, so within a bf16 step of the exact result; in float32
within float32 sums' error. At every row count its tiles and work items split (1-5 left over
after tiles of 6, chunks of 96; on AMX tiles of 16 rows, items of 64, inputs in chunks of 64 or 256, a short step's single
tile; on the FMA path tiles of 6 rows, slabs of 256 inputs). On an AMX
CPU the weights whose input width is a multiple of 32 take the AMX path and the others (k = 2,
8) the vdpbf16ps one; a build without AMX checks the latter on the same shapes. The FMA path
(AVX2: bf16 weights widened to float32, and every float32 matmul) is what an AVX2-only CPU
runs; on an AVX-512 CPU a build without AVX-512 checks it: tests/kernels/cpu/test_cpu_matmul_fma.py."""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest
import torch

from kernels.cpu.layer import native_layer
from kernels.cpu.matmul import (
    EXTRA_FLAGS,
    SOURCE,
    NativeMatmul,
    deinterleave_gate_up,
    deinterleave_outputs,
    interleave_gate_up,
    packed_size,
    unpack,
)
from kernels.cpu.native.build import build
from tests.kernels.cpu.matmul_cases import (
    KERNEL,
    at_thread_counts,
    case,
    fused_silu_against_separate,
    needs_bf16_dot,
    within_a_bf16_step,
)


@needs_bf16_dot
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 6, 7, 13, 16, 17, 64, 65, 97, 200])
@pytest.mark.parametrize(
    "n, k", [(64, 2), (1280, 768), (100, 64), (768, 2048), (130, 96), (96, 320)]
)
@pytest.mark.parametrize("bias", [False, True])
def test_matches_the_float64_products(rows: int, n: int, k: int, bias: bool) -> None:
    x, w, b, exact = case(rows, n, k, bias)
    y = KERNEL(x, KERNEL.pack(w), n, b)
    assert y.shape == (rows, n)
    within_a_bf16_step(y, exact)
    # and it agrees with F.linear almost everywhere (the same sums in another order)
    same = (y == torch.nn.functional.linear(x, w, b)).float().mean().item()
    assert same > 0.98


@needs_bf16_dot
def test_rows_are_independent_and_strided_inputs_are_taken() -> None:
    x, w, _, exact = case(20, 192, 256, bias=False)
    packed = KERNEL.pack(w)
    whole = KERNEL(x, packed, 192)
    for r in (0, 5, 6, 19):  # a row alone gives that row of the twenty, whichever tile it was in
        assert torch.equal(KERNEL(x[r : r + 1], packed, 192), whole[r : r + 1])
    assert torch.equal(KERNEL(x[3:15], packed, 192), whole[3:15])
    wide = torch.zeros(20, 512, dtype=torch.bfloat16)
    wide[:, :256] = x
    assert torch.equal(KERNEL(wide[:, :256], packed, 192), whole)  # rows 512 apart, read in place
    assert torch.equal(KERNEL(x.T.contiguous().T, packed, 192), whole)  # column-major: copied
    assert KERNEL(x[:0], packed, 192).shape == (0, 192)
    within_a_bf16_step(whole, exact)


@needs_bf16_dot
@pytest.mark.parametrize("rows", [8, 64, 200])
def test_any_thread_count_gives_the_same_bits(rows: int) -> None:
    """Each thread takes a run of consecutive work items and asks for the next one's block
    while it computes this one's later tiles: any split (more threads than blocks included)
    computes every output once, in the same order."""
    x, w, b, exact = case(rows, 1280, 768, bias=True, seed=4)
    packed = KERNEL.pack(w)
    outs = at_thread_counts(lambda: KERNEL(x, packed, 1280, b))
    within_a_bf16_step(outs[1], exact)
    for threads, y in outs.items():
        assert torch.equal(y, outs[1]), threads


@needs_bf16_dot
@pytest.mark.parametrize("rows", [1, 7, 64])
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_asking_for_spans_changes_no_value(rows: int, threads: int) -> None:
    """matmul_spans_bf16 (the native decode step's, kernels/cpu/native/decoder.cpp): the tiles also ask
    for memory a later kernel reads (more or fewer lines than the tiles can ask for, spans of
    odd sizes); the outputs are matmul_bf16's, bit for bit."""
    x, w, b, exact = case(rows, 1280, 768, bias=True, seed=5)
    packed = KERNEL.pack(w)
    entry = ctypes.CDLL(str(build(source=SOURCE, extra_flags=EXTRA_FLAGS))).matmul_spans_bf16
    p, i = ctypes.c_void_p, ctypes.c_int64
    entry.argtypes, entry.restype = [p, i, i, i, p, p, i, p, i, ctypes.c_int, p, i], None
    memory = torch.zeros(3 << 20, dtype=torch.uint8)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        plain = KERNEL(x, packed, 1280, b)
        for lines in (1, 3, 700):  # a span's lines; 700 x 64 spans is more than the tiles ask for
            count = min(64, memory.numel() // (64 * lines))
            spans = torch.tensor(
                [[memory.data_ptr() + 64 * lines * j, lines] for j in range(count)],
                dtype=torch.int64,
            )
            y = torch.empty(rows, 1280, dtype=torch.bfloat16)
            entry(x.data_ptr(), rows, x.stride(0), 768, packed.data_ptr(), b.data_ptr(), 1280,
                  y.data_ptr(), y.stride(0), threads, spans.data_ptr(), count)  # fmt: skip
            assert torch.equal(y, plain), lines
    finally:
        torch.set_num_threads(before)
    within_a_bf16_step(plain, exact)


@needs_bf16_dot
@pytest.mark.skipif(KERNEL.tiled(8), reason="this CPU's bf16 path packs column tiles of 16")
def test_the_packed_layout_pads_outputs_to_blocks_of_64_and_unpacks() -> None:
    w = torch.randn(100, 8).bfloat16()
    packed = KERNEL.pack(w)
    assert packed.numel() == packed_size(100, 8) == 128 * 8
    # block 0, pair 0: outputs 0..63 side by side, each as (w[c, 0], w[c, 1])
    assert torch.equal(packed[:128].view(64, 2), w[:64, :2])
    # the last block's outputs past 100 are zero
    last = packed[64 * 8 :].view(4, 64, 2)
    assert torch.equal(last[:, :36], w[64:].view(36, 4, 2).transpose(0, 1))
    assert not last[:, 36:].any()
    assert torch.equal(unpack(packed, 100, 8), w)


needs_amx = pytest.mark.skipif(
    not KERNEL.amx, reason="this CPU (or its kernel) gives no AMX tiles: the AMX path is not built"
)


@needs_amx
def test_the_amx_layout_holds_column_tiles_of_16_and_unpacks() -> None:
    n, k = 100, 64
    w = torch.randn(n, k).bfloat16()
    assert KERNEL.tiled(k) and not KERNEL.tiled(8)  # whole tiles of 32 inputs only
    packed = KERNEL.pack(w)
    assert packed.numel() == packed_size(n, k)
    # block 0, column tile 0: outputs 0..15, pair after pair, each output's pair side by side
    first = packed[: k * 16].view(k // 2, 16, 2)
    assert torch.equal(first, w[:16].view(16, k // 2, 2).transpose(0, 1))
    # column tile 1 follows it whole
    second = packed[k * 16 : k * 32].view(k // 2, 16, 2)
    assert torch.equal(second, w[16:32].view(16, k // 2, 2).transpose(0, 1))
    # the last block's outputs past 100 are zero: its tiles 2 and 3 hold outputs 96..127
    last = packed[64 * k :].view(4, k // 2, 16, 2)
    assert torch.equal(last[2, :, :4], w[96:].view(4, k // 2, 2).transpose(0, 1))
    assert not last[2, :, 4:].any() and not last[3].any()
    assert torch.equal(KERNEL.unpack(packed, n, k), w)
    assert not torch.equal(unpack(packed, n, k), w)  # the other layout's reading differs


@needs_amx
@pytest.mark.parametrize("rows", [1, 15, 16, 33, 64, 129])
def test_amx_and_the_dot_product_build_agree(rows: int, tmp_path: Path) -> None:
    """The AMX path against the same library built without AMX (the vdpbf16ps loop every
    machine with AVX512-BF16 runs): both within a bf16 step of the exact products and, summing
    in another order, equal almost everywhere."""
    plain = NativeMatmul(build(tmp_path, source=SOURCE, extra_flags=("-mno-amx-tile",)))
    assert plain.available and not plain.amx and not plain.tiled(768)
    x, w, b, exact = case(rows, 320, 768, bias=True, seed=rows)
    by_amx = KERNEL(x, KERNEL.pack(w), 320, b)
    by_dot = plain(x, plain.pack(w), 320, b)
    within_a_bf16_step(by_amx, exact)
    within_a_bf16_step(by_dot, exact)
    assert (by_amx == by_dot).float().mean().item() > 0.98


@needs_bf16_dot
def test_bad_calls_are_refused() -> None:
    w = torch.randn(64, 32).bfloat16()
    packed = KERNEL.pack(w)
    with pytest.raises(ValueError, match="takes \\[rows, k\\] bf16"):
        KERNEL(torch.randn(1, 32).half(), packed, 64)
    with pytest.raises(ValueError, match="takes \\[rows, k\\] bf16"):
        KERNEL(torch.randn(2, 1, 32).bfloat16(), packed, 64)
    with pytest.raises(ValueError, match="not \\[64, 30\\]"):
        KERNEL(torch.randn(1, 30).bfloat16(), packed, 64)
    with pytest.raises(ValueError, match="bias must be contiguous"):
        KERNEL(torch.randn(1, 32).bfloat16(), packed, 64, torch.randn(63).bfloat16())
    with pytest.raises(ValueError, match=r"bias must be torch\.bfloat16"):
        KERNEL(torch.randn(1, 32).bfloat16(), packed, 64, torch.randn(64))
    if KERNEL.f32_available:  # a float32 x against a bf16 copy
        with pytest.raises(
            ValueError, match=r"packed weight is torch\.bfloat16, x is torch\.float32"
        ):
            KERNEL(torch.randn(1, 32), packed, 64)
    for bad in (torch.randn(64, 31).bfloat16(), torch.randn(64, 32).half()):
        assert not KERNEL.packs(bad)
        with pytest.raises(ValueError, match="kernel packs bf16 or float32"):
            KERNEL.pack(bad)


def test_without_the_instructions_the_kernel_says_so(tmp_path: Path) -> None:
    """What CPUs without the instructions get: a library that reports itself unavailable, so the
    engine keeps oneDNN."""
    portable = NativeMatmul(
        build(tmp_path, source=SOURCE, extra_flags=("-mno-avx512bf16", "-mno-avx2", "-mno-fma"))
    )
    assert not portable.available and not portable.f32_available
    for weight in (torch.randn(64, 32).bfloat16(), torch.randn(64, 32)):
        assert not portable.packs(weight)
        with pytest.raises(ValueError, match="bf16: False, float32: False"):
            portable.pack(weight)


@needs_bf16_dot
@pytest.mark.parametrize("rows", [1, 6, 13, 100, 200])
@pytest.mark.parametrize("bias", [False, True])
def test_the_fused_silu_equals_the_matmul_then_silu_mul(rows: int, bias: bool) -> None:
    """The gate/up projection and SiLU in one pass: bit for bit the separate matmul (gate and up
    rounded to bf16) and kernels/cpu/native/layer.cpp's silu_mul, on the interleaved weight."""
    width = 96
    x, w, b, _ = case(rows, 2 * width, 64, bias, seed=rows)
    fused, separate, packed, b_mixed = fused_silu_against_separate(x, w, b, width)
    assert torch.equal(fused, separate)
    # the same packed copy serves the plain matmul, its outputs put back in order
    plain = deinterleave_outputs(KERNEL(x, packed, 2 * width, b_mixed), width)
    assert torch.equal(plain, KERNEL(x, KERNEL.pack(w), 2 * width, b))
    assert torch.equal(deinterleave_gate_up(interleave_gate_up(w, width), width), w)
    with pytest.raises(ValueError, match="multiples of 32"):
        KERNEL.silu(x, packed, 80, b_mixed)


@needs_bf16_dot
def test_the_fused_silu_keeps_the_separate_bits_at_special_values() -> None:
    """NaN, infinities, a gate below exp's cut-off (-87), subnormal and huge gates and ups: the
    fused pass (vectorised by hand on AVX-512) rounds each as silu_mul does, bit for bit."""
    width, rows = 64, 5
    specials = [float("nan"), float("inf"), -float("inf"), -100.0, -87.5, 1e-39, -1e-39, 3e38]
    gen = torch.Generator().manual_seed(7)
    # tiny products, so each output is its bias's value or next to it
    x = (torch.randn(rows, 64, generator=gen) * 1e-3).bfloat16()
    w = torch.randn(2 * width, 64, generator=gen).bfloat16()
    b = torch.randn(2 * width, generator=gen) * 8
    b[: len(specials)] = torch.tensor(specials)  # gates
    b[width : width + len(specials)] = torch.tensor(specials[::-1])  # the ups beside them
    b = b.bfloat16()
    separate = native_layer().silu_mul(KERNEL(x, KERNEL.pack(w), 2 * width, b))
    packed = KERNEL.pack(interleave_gate_up(w, width))
    fused = KERNEL.silu(x, packed, width, interleave_gate_up(b, width).contiguous())
    assert separate[:, : len(specials)].isnan().any()  # the specials reached the outputs
    assert torch.equal(fused.view(torch.int16), separate.view(torch.int16))
