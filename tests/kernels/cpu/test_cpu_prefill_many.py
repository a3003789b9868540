"""Every prefill chunk of a step in one call (kernels/cpu/prefill.py `NativePrefill.many`, as
engine/step/attention.py runs them): the same bits as a call per chunk, written into the chunks'
rows of the step's output and nowhere else; bad tables are refused before the kernel runs."""

from __future__ import annotations

import math

import pytest
import torch

from kernels.cpu.prefill import PrefillChunks, native_prefill

KERNEL = native_prefill()
DTYPES = [d for d in (torch.bfloat16, torch.float32) if KERNEL.supports(d, torch.device("cpu"), 64)]
pytestmark = pytest.mark.skipif(
    not DTYPES, reason="this CPU has neither AVX512-BF16 nor AVX2 + FMA: no prefill kernel"
)
HEADS, KV_HEADS, HEAD_DIM = 4, 2, 64
# (rows, tokens before) per chunk, after 3 decode rows the kernel must leave alone
CHUNKS = [(5, 0), (70, 0), (16, 40), (1, 100), (33, 7)]
DECODE_ROWS = 3


def _step(dtype: torch.dtype, seed: int = 0):  # type: ignore[no-untyped-def]
    gen = torch.Generator().manual_seed(seed)
    num_slots = 1024
    free = torch.randperm(num_slots, generator=gen)
    k_cache = torch.randn(KV_HEADS, num_slots, HEAD_DIM, generator=gen).to(dtype)
    v_cache = torch.randn(KV_HEADS, num_slots, HEAD_DIM, generator=gen).to(dtype)
    rows = DECODE_ROWS + sum(n for n, _ in CHUNKS)
    qkv = torch.randn(rows, (HEADS + 2 * KV_HEADS) * HEAD_DIM, generator=gen).to(dtype)
    q = qkv[:, : HEADS * HEAD_DIM].view(rows, HEADS, HEAD_DIM)
    chunks, first, used = [], DECODE_ROWS, 0
    for length, before in CHUNKS:
        slots = free[used : used + before + length]
        used += before + length
        chunks.append((first, length, before, slots))
        first += length
    return q, k_cache, v_cache, chunks


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_one_call_equals_a_call_per_chunk(dtype: torch.dtype) -> None:
    q, k_cache, v_cache, chunks = _step(dtype)
    out = torch.full(q.shape, math.nan, dtype=dtype)
    KERNEL.many(q, k_cache, v_cache, PrefillChunks.build(chunks), 0.125, out)
    assert out[:DECODE_ROWS].isnan().all()  # not a chunk's rows: untouched
    for first, length, before, slots in chunks:
        alone = KERNEL(q[first : first + length], k_cache, v_cache, slots, before, 0.125)
        assert not alone.isnan().any()
        assert torch.equal(out[first : first + length], alone)


def test_bad_chunks_are_refused() -> None:
    dtype = DTYPES[0]
    q, k_cache, v_cache, chunks = _step(dtype)
    out = torch.empty(q.shape, dtype=dtype)
    first, length, before, slots = chunks[2]
    with pytest.raises(ValueError, match=r"slots must be \[56\]"):
        PrefillChunks.build([(first, length, before, slots[:-1])])
    with pytest.raises(ValueError, match="no chunks"):
        PrefillChunks.build([])
    with pytest.raises(ValueError, match="from a row >= 0"):
        PrefillChunks.build([(-1, length, before, slots)])
    far = PrefillChunks.build([(first, length, before, slots + 5000)])
    with pytest.raises(ValueError, match="outside the cache's 1024"):
        KERNEL.many(q, k_cache, v_cache, far, 0.125, out)
    past = PrefillChunks.build([(q.shape[0] - 2, length, before, slots)])
    with pytest.raises(ValueError, match=f"cover {q.shape[0] - 2 + length} rows"):
        KERNEL.many(q, k_cache, v_cache, past, 0.125, out)
    good = PrefillChunks.build(chunks)
    with pytest.raises(ValueError, match="out must be a contiguous"):
        KERNEL.many(
            q, k_cache, v_cache, good, 0.125, out.transpose(0, 1).contiguous().transpose(0, 1)
        )
