"""The native prefill attention (kernels/cpu/native/prefill.cpp through kernels/cpu/prefill.py) against
the form it replaces (engine/step/attention.py `prefill_matmul`: two bf16 matmuls around the native
causal softmax) and a float64 oracle: fresh chunks and chunks after cached tokens, keys scattered
over a cache whose unused slots hold NaN (reading a key the chunk may not see poisons it). bf16
by AMX tiles where the CPU has AMX (kernels/cpu/native/prefill_amx.h), else AVX512-BF16 or (AVX2) the
FMA path, float32 by the FMA path; a build without AMX checks the AVX512-BF16 path on an AMX
CPU, and on an AVX-512 CPU a build without AVX-512 checks the FMA path too."""

from __future__ import annotations

import math

import pytest
import torch

from engine.step.attention import PrefillSegment, prefill_matmul
from kernels.cpu.layer import native_layer
from kernels.cpu.native.build import build
from kernels.cpu.prefill import SOURCE, NativePrefill, native_prefill

KERNEL = native_prefill()
needs_bf16_dot = pytest.mark.skipif(
    not KERNEL.available,
    reason="this CPU has neither AVX512-BF16 nor AVX2 + FMA: the kernel is built without them",
)
needs_fma = pytest.mark.skipif(
    not KERNEL.f32_available, reason="this CPU has no AVX2 + FMA: no float32 path is built"
)


def _case(  # type: ignore[no-untyped-def]
    query_len: int,
    offset: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    seed: int,
    dtype: torch.dtype = torch.bfloat16,
):
    gen = torch.Generator().manual_seed(seed)
    num_slots = 2 * (offset + query_len) + 64
    slots = torch.randperm(num_slots, generator=gen)[: offset + query_len]
    k_cache = torch.full((kv_heads, num_slots, head_dim), math.nan)
    v_cache = torch.full_like(k_cache, math.nan)
    k_cache[:, slots] = torch.randn(kv_heads, len(slots), head_dim, generator=gen)
    v_cache[:, slots] = torch.randn(kv_heads, len(slots), head_dim, generator=gen)
    k_cache, v_cache = k_cache.to(dtype), v_cache.to(dtype)
    # q as the model hands it: a view into the fused qkv projection
    qkv = torch.randn(query_len, (heads + 2 * kv_heads) * head_dim, generator=gen).to(dtype)
    q = qkv[:, : heads * head_dim].view(query_len, heads, head_dim)
    return q, k_cache, v_cache, slots


def _reference(q, k_cache, v_cache, slots, offset, scale):  # type: ignore[no-untyped-def]
    chunk = slots[offset:]
    k = k_cache[:, chunk].transpose(0, 1)  # the chunk's own keys, as the model hands them
    v = v_cache[:, chunk].transpose(0, 1)
    seg = PrefillSegment(0, q.shape[0], offset, slots if offset else None)
    return prefill_matmul(q, k, v, k_cache, v_cache, seg, scale, native_layer())


def _oracle(q, k_cache, v_cache, slots, offset, scale):  # type: ignore[no-untyped-def]
    group = q.shape[1] // k_cache.shape[0]
    k = k_cache[:, slots].double().repeat_interleave(group, 0)  # [heads, ctx, head_dim]
    v = v_cache[:, slots].double().repeat_interleave(group, 0)
    scores = torch.einsum("thd,hjd->htj", q.double(), k) * scale
    t = torch.arange(q.shape[0])[:, None]
    scores = scores.masked_fill(torch.arange(len(slots))[None, :] > offset + t, -math.inf)
    return torch.einsum("htj,hjd->thd", scores.softmax(-1), v)


CASES = [(1, 0), (5, 0), (64, 0), (70, 0), (100, 37), (13, 120), (129, 1)]
SHAPES = [(12, 4, 64), (8, 8, 128), (4, 1, 64)]


@needs_bf16_dot
@pytest.mark.parametrize("query_len, offset", CASES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_matches_the_matmul_form_and_the_oracle(query_len, offset, shape) -> None:  # type: ignore[no-untyped-def]
    _check_bf16(KERNEL, query_len, offset, shape)


def _check_bf16(kernel: NativePrefill, query_len: int, offset: int, shape: tuple[int, ...]) -> None:
    heads, kv_heads, head_dim = shape
    q, k_cache, v_cache, slots = _case(query_len, offset, heads, kv_heads, head_dim, seed=query_len)
    scale = head_dim**-0.5
    out = kernel(q, k_cache, v_cache, slots, offset, scale)
    assert out.shape == q.shape and out.dtype is torch.bfloat16 and not out.isnan().any()
    reference = _reference(q, k_cache.nan_to_num(), v_cache.nan_to_num(), slots, offset, scale)
    # the same roundings, float32 sums in another order: mostly equal, and within a bf16 step
    # of each output row's largest value. (Not of each value: where a score's rounding flips,
    # as against an AMX CPU's bmm, a probability moves by a bf16 step, and an output that
    # cancels to near zero moves by that step of the values it sums.)
    step = reference.float().abs().amax(-1, keepdim=True).clamp_min(2**-20) * 2**-7
    assert ((out.float() - reference.float()).abs() <= step).all()
    assert (out == reference).float().mean() > 0.95
    oracle = _oracle(q, k_cache, v_cache, slots, offset, scale)
    ours, theirs = (out.double() - oracle).abs().max(), (reference.double() - oracle).abs().max()
    assert ours <= theirs * 1.5 + 1e-3


@needs_fma
@pytest.mark.parametrize("query_len, offset", CASES)
@pytest.mark.parametrize("shape", [*SHAPES, (6, 2, 48)], ids=str)
def test_float32_matches_the_matmul_form_and_the_oracle(query_len, offset, shape) -> None:  # type: ignore[no-untyped-def]
    """float32 (the FMA path; head_dim a multiple of 16): the matmul form's values to float32
    sums' error, as close to the oracle."""
    heads, kv_heads, head_dim = shape
    q, k_cache, v_cache, slots = _case(
        query_len, offset, heads, kv_heads, head_dim, seed=query_len, dtype=torch.float32
    )
    scale = head_dim**-0.5
    out = KERNEL(q, k_cache, v_cache, slots, offset, scale)
    assert out.shape == q.shape and out.dtype is torch.float32 and not out.isnan().any()
    reference = _reference(q, k_cache.nan_to_num(), v_cache.nan_to_num(), slots, offset, scale)
    torch.testing.assert_close(out, reference, rtol=1e-5, atol=1e-5)
    oracle = _oracle(q, k_cache, v_cache, slots, offset, scale)
    torch.testing.assert_close(out.double(), oracle, rtol=1e-4, atol=1e-5)


@needs_fma
@pytest.mark.parametrize("query_len, offset", [(5, 0), (70, 0), (100, 37)])
def test_the_fma_path_in_bf16(query_len: int, offset: int, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """bf16 by FMAs (what an AVX2 CPU runs; on an AVX-512 CPU a build without AVX-512), held to
    what the AVX512-BF16 path is held to."""
    fma = NativePrefill(build(tmp_path, source=SOURCE, extra_flags=("-mno-avx512f",)))
    assert fma.available and fma.supports(torch.bfloat16, torch.device("cpu"), 48)
    _check_bf16(fma, query_len, offset, (12, 4, 64))


@needs_bf16_dot
@pytest.mark.parametrize("query_len, offset", [(5, 0), (70, 0), (100, 37), (33, 31)])
def test_the_build_without_amx(query_len: int, offset: int, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """-mno-amx-tile: on an AMX CPU the AVX512-BF16 dot-product path the default build no longer
    takes there (elsewhere the same path as the default build), held to the same bounds."""
    dot = NativePrefill(build(tmp_path, source=SOURCE, extra_flags=("-mno-amx-tile",)))
    _check_bf16(dot, query_len, offset, (12, 4, 64))


@needs_bf16_dot
@pytest.mark.parametrize("query_len, offset", [(48, 0), (20, 300)])
def test_scores_far_below_the_row_maximum(query_len: int, offset: int) -> None:
    """Queries scaled up so a row's scores span hundreds: the exps far below the maximum (under
    e^-87) are zeros, not NaN or noise, in every path's softmax, the AMX path's faster exp
    included."""
    q, k_cache, v_cache, slots = _case(query_len, offset, 12, 4, 64, seed=7)
    q = (q.float() * 40).bfloat16()
    scale = 64**-0.5
    out = KERNEL(q, k_cache, v_cache, slots, offset, scale)
    assert not out.isnan().any()
    reference = _reference(q, k_cache.nan_to_num(), v_cache.nan_to_num(), slots, offset, scale)
    step = reference.float().abs().amax(-1, keepdim=True).clamp_min(2**-20) * 2**-7
    assert ((out.float() - reference.float()).abs() <= step).all()
    oracle = _oracle(q, k_cache, v_cache, slots, offset, scale)
    ours, theirs = (out.double() - oracle).abs().max(), (reference.double() - oracle).abs().max()
    assert ours <= theirs * 1.5 + 1e-3


@needs_bf16_dot
def test_bad_calls_are_refused() -> None:
    q, k_cache, v_cache, slots = _case(8, 4, 4, 2, 64, seed=0)
    with pytest.raises(ValueError, match="takes bf16"):
        KERNEL(q.half(), k_cache.half(), v_cache.half(), slots, 4, 0.125)
    with pytest.raises(ValueError, match="head_dim 8"):
        KERNEL(
            q[..., :8],
            k_cache[..., :8].contiguous(),
            v_cache[..., :8].contiguous(),
            slots,
            4,
            0.1,
        )
    with pytest.raises(ValueError, match=r"slots must be \[offset \+ query_len\] = \[12\]"):
        KERNEL(q, k_cache, v_cache, slots[:-1], 4, 0.125)
    with pytest.raises(ValueError, match="contiguous"):
        KERNEL(q, k_cache.transpose(0, 1).contiguous().transpose(0, 1), v_cache, slots, 4, 0.125)
    with pytest.raises(ValueError, match="dtypes differ"):
        KERNEL(q, k_cache.float(), v_cache.float(), slots, 4, 0.125)
    assert not KERNEL.supports(torch.float16, torch.device("cpu"), 64)


def test_without_the_instructions_the_kernel_says_so(tmp_path) -> None:  # type: ignore[no-untyped-def]
    portable = NativePrefill(
        build(tmp_path, source=SOURCE, extra_flags=("-mno-avx512bf16", "-mno-avx2", "-mno-fma"))
    )
    assert not portable.available and not portable.f32_available
    for dtype in (torch.bfloat16, torch.float32):
        assert not portable.supports(dtype, torch.device("cpu"), 64)
