"""The native prefill attention (kernels/cpu_prefill.cpp through kernels/cpu_prefill.py) against
the form it replaces (engine/attention.py `prefill_matmul`: two bf16 matmuls around the native
causal softmax) and a float64 oracle: fresh chunks and chunks after cached tokens, keys scattered
over a cache whose unused slots hold NaN (reading a key the chunk may not see poisons it)."""

from __future__ import annotations

import math

import pytest
import torch

from engine.attention import PrefillSegment, prefill_matmul
from kernels.cpu_layer import native_layer
from kernels.cpu_native import build
from kernels.cpu_prefill import SOURCE, NativePrefill, native_prefill

KERNEL = native_prefill()
needs_bf16_dot = pytest.mark.skipif(
    not KERNEL.available, reason="this CPU has no AVX512-BF16: the kernel is built without it"
)


def _case(query_len: int, offset: int, heads: int, kv_heads: int, head_dim: int, seed: int):  # type: ignore[no-untyped-def]
    gen = torch.Generator().manual_seed(seed)
    num_slots = 2 * (offset + query_len) + 64
    slots = torch.randperm(num_slots, generator=gen)[: offset + query_len]
    k_cache = torch.full((kv_heads, num_slots, head_dim), math.nan)
    v_cache = torch.full_like(k_cache, math.nan)
    k_cache[:, slots] = torch.randn(kv_heads, len(slots), head_dim, generator=gen)
    v_cache[:, slots] = torch.randn(kv_heads, len(slots), head_dim, generator=gen)
    k_cache, v_cache = k_cache.bfloat16(), v_cache.bfloat16()
    # q as the model hands it: a view into the fused qkv projection
    qkv = torch.randn(query_len, (heads + 2 * kv_heads) * head_dim, generator=gen).bfloat16()
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


@needs_bf16_dot
@pytest.mark.parametrize(
    "query_len, offset", [(1, 0), (5, 0), (64, 0), (70, 0), (100, 37), (13, 120), (129, 1)]
)
@pytest.mark.parametrize("shape", [(12, 4, 64), (8, 8, 128), (4, 1, 64)], ids=str)
def test_matches_the_matmul_form_and_the_oracle(query_len, offset, shape) -> None:  # type: ignore[no-untyped-def]
    heads, kv_heads, head_dim = shape
    q, k_cache, v_cache, slots = _case(query_len, offset, heads, kv_heads, head_dim, seed=query_len)
    scale = head_dim**-0.5
    out = KERNEL(q, k_cache, v_cache, slots, offset, scale)
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


@needs_bf16_dot
def test_bad_calls_are_refused() -> None:
    q, k_cache, v_cache, slots = _case(8, 4, 4, 2, 64, seed=0)
    with pytest.raises(ValueError, match="bf16 CPU tensors"):
        KERNEL(q.float(), k_cache.float(), v_cache.float(), slots, 4, 0.125)
    with pytest.raises(ValueError, match="head_dim 32"):
        KERNEL(
            q[..., :32],
            k_cache[..., :32].contiguous(),
            v_cache[..., :32].contiguous(),
            slots,
            4,
            0.1,
        )
    with pytest.raises(ValueError, match=r"slots must be \[offset \+ query_len\] = \[12\]"):
        KERNEL(q, k_cache, v_cache, slots[:-1], 4, 0.125)
    with pytest.raises(ValueError, match="contiguous"):
        KERNEL(q, k_cache.transpose(0, 1).contiguous().transpose(0, 1), v_cache, slots, 4, 0.125)
    assert not KERNEL.supports(torch.float32, torch.device("cpu"), 64)


def test_without_avx512_bf16_the_kernel_says_so(tmp_path) -> None:  # type: ignore[no-untyped-def]
    portable = NativePrefill(build(tmp_path, source=SOURCE, extra_flags=("-mno-avx512bf16",)))
    assert not portable.available
    assert not portable.supports(torch.bfloat16, torch.device("cpu"), 64)
