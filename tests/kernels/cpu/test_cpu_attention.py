"""The hand-written decode attention (kernels/cpu/native/attention.cpp through kernels/cpu/attention.py)
against the eager path it replaces (gather each row's blocks, then `decode_matmul`) and a float64
oracle, on the build this machine gets (AVX512-BF16 dot products, AVX-512 or AVX2 registers)
and on the other builds: AVX-512 without its bf16 instructions (-mno-avx512bf16), AVX2
(-mno-avx512f) and portable C (-mno-avx512f -mno-avx2). On an AMX CPU the bf16 shapes whose
blocks hold a multiple of 16 slots (and at most 16 query heads share a KV head) take the AMX
scores; the -mno-amx-tile build is then the vdpbf16ps path on the same cases."""

from __future__ import annotations

import math

import pytest
import torch

from engine.step.attention import AttentionMetadata, decode_attention
from kernels.cpu.attention import SOURCE, NativePagedDecode, native_paged_decode
from kernels.cpu.native.build import build


def _case(
    *, rows: int, heads: int, kv_heads: int, head_dim: int, block_size: int, dtype: torch.dtype,
    seed: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, list[int]]:  # fmt: skip
    """Rows of very different lengths (1, partial blocks, whole blocks) whose blocks lie
    shuffled over a cache whose every unused slot holds NaN: reading past a row's length, or
    a block it does not own, poisons its output."""
    gen = torch.Generator().manual_seed(seed)
    lengths = [1, block_size, block_size + 1, 3 * block_size - 1, 70, 5][:rows]
    lengths += [int(n) for n in torch.randint(1, 90, (rows - len(lengths),), generator=gen)]
    needed = [-(-n // block_size) for n in lengths]
    num_blocks = sum(needed) + 7
    order = torch.randperm(num_blocks, generator=gen).tolist()
    width = max(needed) + 2  # wider than any row: padding entries must not be read
    tables = torch.zeros(rows, width, dtype=torch.long)
    k_cache = torch.full((kv_heads, num_blocks * block_size, head_dim), math.nan)
    v_cache = torch.full_like(k_cache, math.nan)
    for row, (n, blocks) in enumerate(zip(lengths, needed, strict=True)):
        owned = [order.pop() for _ in range(blocks)]
        tables[row, :blocks] = torch.tensor(owned)
        tables[row, blocks:] = order[0]  # a block this row does not own (NaN past its users)
        slots = torch.tensor([owned[p // block_size] * block_size + p % block_size
                              for p in range(n)])  # fmt: skip
        k_cache[:, slots] = torch.randn(kv_heads, n, head_dim, generator=gen)
        v_cache[:, slots] = torch.randn(kv_heads, n, head_dim, generator=gen)
    # q as the model hands it: a view into the fused qkv projection, rows wider than the heads
    qkv = torch.randn(rows, (heads + 2 * kv_heads) * head_dim, generator=gen)
    q = qkv[:, : heads * head_dim].view(rows, heads, head_dim)
    return q.to(dtype), k_cache.to(dtype), v_cache.to(dtype), tables, lengths


def _eager(q, k_cache, v_cache, tables, lengths, block_size):  # type: ignore[no-untyped-def]
    meta = AttentionMetadata(
        slot_mapping=torch.empty(0, dtype=torch.long),
        num_decodes=q.shape[0],
        block_size=block_size,
        decode_tables=tables,
        decode_lengths=lengths,
        prefills=[],
        decode_backend="matmul",
    )
    return decode_attention(
        q, k_cache.nan_to_num(), v_cache.nan_to_num(), meta, q.shape[-1] ** -0.5
    )


def _oracle(q, k_cache, v_cache, tables, lengths, block_size):  # type: ignore[no-untyped-def]
    rows, heads, head_dim = q.shape
    group = heads // k_cache.shape[0]
    out = torch.empty(rows, heads, head_dim, dtype=torch.float64)
    for row, n in enumerate(lengths):
        slots = torch.tensor([int(tables[row, p // block_size]) * block_size + p % block_size
                              for p in range(n)])  # fmt: skip
        k = k_cache[:, slots].double().repeat_interleave(group, 0)  # [heads, n, head_dim]
        v = v_cache[:, slots].double().repeat_interleave(group, 0)
        scores = torch.einsum("hd,hnd->hn", q[row].double(), k) / math.sqrt(head_dim)
        out[row] = torch.einsum("hn,hnd->hd", scores.softmax(-1), v)
    return out


SHAPES = [  # (heads, kv_heads, head_dim, block_size): the AVX-512 sizes and the portable ones
    (12, 4, 64, 16),  # the small model: group 3
    (8, 8, 128, 16),  # no grouping, head_dim 128
    (12, 4, 64, 32),  # two tiles of 16 keys a block (AMX)
    (16, 1, 64, 16),  # 16 query heads on one KV head: the most the AMX scores take
    (17, 1, 64, 16),  # one more: the vdpbf16ps path
    (6, 2, 128, 8),  # group 3 at head_dim 128: the bf16 value pass takes its heads 2 + 1
    (8, 2, 64, 1),  # one token a block
    (6, 2, 8, 4),  # head_dim the AVX-512 path does not take
    (4, 1, 48, 8),  # head_dim not a multiple of 16
]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "h{}kv{}d{}b{}".format(*s))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_matches_the_eager_path_and_the_oracle(shape: tuple[int, int, int, int], dtype) -> None:
    heads, kv_heads, head_dim, block_size = shape
    q, k_cache, v_cache, tables, lengths = _case(
        rows=9, heads=heads, kv_heads=kv_heads, head_dim=head_dim, block_size=block_size,
        dtype=dtype, seed=head_dim + block_size,
    )  # fmt: skip
    out = native_paged_decode()(
        q, k_cache, v_cache, tables, torch.tensor(lengths), block_size, head_dim**-0.5
    )
    assert out.dtype == dtype and not out.isnan().any()
    eager = _eager(q, k_cache, v_cache, tables, lengths, block_size)
    oracle = _oracle(q, k_cache, v_cache, tables, lengths, block_size)
    if dtype == torch.float32:
        torch.testing.assert_close(out, eager, atol=2e-6, rtol=2e-6)
        torch.testing.assert_close(out.double(), oracle, atol=1e-5, rtol=1e-5)
    else:
        # the same roundings as the eager path (scores and probabilities held in bf16): at most
        # a bf16 ulp apart from it, and no further from the oracle than the eager path is
        ulp = eager.float().abs().clamp_min(2**-20) * 2**-7
        assert ((out.float() - eager.float()).abs() <= ulp).all()
        ours = (out.double() - oracle).abs().max()
        theirs = (eager.double() - oracle).abs().max()
        assert ours <= theirs * 1.5 + 1e-3


@pytest.mark.parametrize(
    "flags",
    [("-mno-amx-tile",), ("-mno-avx512bf16",), ("-mno-avx512f",), ("-mno-avx512f", "-mno-avx2")],
    ids=["no-amx", "avx512", "avx2", "portable"],
)
def test_the_other_builds_match_this_machines(tmp_path, flags) -> None:  # type: ignore[no-untyped-def]
    portable = NativePagedDecode(build(tmp_path, source=SOURCE, extra_flags=flags))
    for dtype in (torch.float32, torch.bfloat16):
        q, k_cache, v_cache, tables, lengths = _case(
            rows=7, heads=12, kv_heads=4, head_dim=64, block_size=16, dtype=dtype, seed=3
        )
        args = (q, k_cache, v_cache, tables, torch.tensor(lengths), 16, 0.125)
        fast, slow = native_paged_decode()(*args), portable(*args)
        assert not slow.isnan().any()
        tolerance = 2e-6 if dtype == torch.float32 else 1e-2  # summation order, then bf16
        torch.testing.assert_close(fast.float(), slow.float(), atol=tolerance, rtol=tolerance)


def test_refuses_what_it_cannot_read() -> None:
    kernel = native_paged_decode()
    q, k_cache, v_cache, tables, lengths = _case(
        rows=2, heads=4, kv_heads=2, head_dim=16, block_size=4, dtype=torch.float32, seed=0
    )
    lens = torch.tensor(lengths)
    assert not kernel.supports(torch.float16, torch.device("cpu"))
    with pytest.raises(ValueError, match="float16"):
        kernel(q.half(), k_cache.half(), v_cache.half(), tables, lens, 4, 0.25)
    with pytest.raises(ValueError, match="dtypes differ"):
        kernel(q, k_cache.bfloat16(), v_cache.bfloat16(), tables, lens, 4, 0.25)
    with pytest.raises(ValueError, match="contiguous"):
        kernel(q, k_cache.transpose(0, 1), v_cache, tables, lens, 4, 0.25)


@pytest.mark.parametrize("rows", [1, 9])
def test_every_split_between_threads_gives_the_same_bits(rows: int) -> None:
    """The threads take consecutive runs of (row, KV head) pairs, balanced by context length,
    each asking for the next pair's blocks ahead: any thread count (more threads than pairs
    included) computes each pair once, the same way."""
    q, k_cache, v_cache, tables, lengths = _case(
        rows=rows, heads=12, kv_heads=4, head_dim=64, block_size=16, dtype=torch.bfloat16, seed=7
    )
    args = (q, k_cache, v_cache, tables, torch.tensor(lengths), 16, 0.125)
    before = torch.get_num_threads()
    outs = {}
    try:
        for threads in (1, 2, 3, 7, 64):
            torch.set_num_threads(threads)
            outs[threads] = native_paged_decode()(*args)
    finally:
        torch.set_num_threads(before)
    assert not outs[1].isnan().any()
    for threads, out in outs.items():
        assert torch.equal(out, outs[1]), threads
