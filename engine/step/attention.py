"""Attention over the paged KV cache: the PyTorch path (CPU and CUDA).

Cache layout per layer: k_cache, v_cache as [num_kv_heads, num_blocks * block_size, head_dim],
head-major; token at position p of a sequence lives in slot block_table[p // block_size] *
block_size + p % block_size. Head-major, one block of one head is a contiguous run of
block_size * head_dim values, so decode gathers whole blocks (an index per block, not per token)
straight into the [kv_heads, rows, context, head_dim] layout the attention matmuls read, with no
transposing copy. The flat batch holds decode tokens first (one per sequence), then each
prefill chunk contiguously.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

from engine.step.paged_decode import DecodeMetadata, paged_decode
from kernels.cpu.attention import native_paged_decode, paged_decode_op
from kernels.cpu.layer import NativeLayer
from kernels.cpu.prefill import NativePrefill, PrefillChunks

# How decode rows attend: the hand-written CPU kernel that reads the paged cache where it lies
# (kernels/cpu/native/attention.cpp), or, after gathering each row's blocks, two grouped matmuls or
# the fused SDPA kernel. Which is fastest depends on the machine (engine/step/decode_backend.py
# measures them at start-up).
DecodeBackend = Literal["matmul", "sdpa", "native"]


@dataclass
class PrefillSegment:
    query_start: int  # index of the chunk's first token in the flat batch
    query_len: int
    num_computed: int  # tokens of this sequence already in the cache before this chunk
    context_slots: torch.Tensor | None  # [num_computed + query_len] long; None if num_computed == 0

    @property
    def context_len(self) -> int:
        return self.num_computed + self.query_len


@dataclass
class DecodeGroup:
    """Decode rows of similar context length, attended together with little padding."""

    rows: torch.Tensor  # [num_rows] long: rows of the decode batch
    blocks: torch.Tensor  # [num_rows * num_blocks] long, row-major (padding -> block 0)
    mask: torch.Tensor  # [num_rows, num_blocks * block_size] bool, True = attend


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [num_tokens] long: where each new token's K/V is written
    num_decodes: int
    block_size: int
    decode_tables: torch.Tensor | None  # [num_decodes, max_blocks] long (padding -> block 0)
    decode_lengths: list[int]  # context length of each decode row, this step's token included
    prefills: list[PrefillSegment]
    decode_backend: DecodeBackend = "sdpa"
    # Where set, prefill chunks attend by two matmuls around this causal softmax
    # (prefill_matmul); otherwise by SDPA.
    prefill_softmax: NativeLayer | None = None
    # Where set (bf16, AVX512-BF16), the same matmul form in one native call that reads the
    # cache (kernels/cpu/native/prefill.cpp).
    prefill_kernel: NativePrefill | None = None
    # Built on first use and shared by every layer of the step.
    decode_groups: list[DecodeGroup] | None = None
    prefill_chunks: PrefillChunks | None = None  # meta.prefills for prefill_kernel
    decode_context_lens: torch.Tensor | None = None  # decode_lengths as a tensor (native)


# A group grows while its longest context stays within this factor (plus a little slack) of its
# shortest: padded key reads stay under ~25% of the real ones, at a few extra calls per group.
GROUP_LENGTH_RATIO = 1.25
GROUP_LENGTH_SLACK = 32


def decode_groups(meta: AttentionMetadata) -> list[DecodeGroup]:
    if meta.decode_groups is not None:
        return meta.decode_groups
    assert meta.decode_tables is not None
    lengths = meta.decode_lengths
    device = meta.decode_tables.device
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    groups: list[DecodeGroup] = []
    start = 0
    while start < len(order):
        shortest = lengths[order[start]]
        end = start + 1
        while (
            end < len(order)
            and lengths[order[end]] <= shortest * GROUP_LENGTH_RATIO + GROUP_LENGTH_SLACK
        ):
            end += 1
        rows = order[start:end]
        num_blocks = -(-lengths[rows[-1]] // meta.block_size)
        index = torch.tensor(rows, dtype=torch.long, device=device)
        positions = torch.arange(num_blocks * meta.block_size, device=device)
        group_lengths = torch.tensor([lengths[r] for r in rows], device=device)
        groups.append(
            DecodeGroup(
                rows=index,
                blocks=meta.decode_tables[index, :num_blocks].reshape(-1),
                mask=positions[None, :] < group_lengths[:, None],
            )
        )
        start = end
    meta.decode_groups = groups
    return groups


def paged_attention(
    q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    v: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    k_cache: torch.Tensor,  # [num_kv_heads, num_slots, head_dim]
    v_cache: torch.Tensor,
    meta: AttentionMetadata | DecodeMetadata,
    scale: float,
) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
    k_cache.index_copy_(1, meta.slot_mapping, k.transpose(0, 1))
    v_cache.index_copy_(1, meta.slot_mapping, v.transpose(0, 1))
    return attend_paged(q, k, v, k_cache, v_cache, meta, scale)


def attend_paged(
    q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    v: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    k_cache: torch.Tensor,  # [num_kv_heads, num_slots, head_dim], this step's K/V written
    v_cache: torch.Tensor,
    meta: AttentionMetadata | DecodeMetadata,
    scale: float,
) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
    """Attention of this step's queries over the cache, once their K/V are in it (the model
    writes them with RoPE: engine/models/layer_ops.py)."""
    if isinstance(meta, DecodeMetadata):  # the compiled decode-only forward
        if meta.native:
            return paged_decode_op(
                q, k_cache, v_cache, meta.block_tables, meta.context_lens, meta.block_size, scale
            )
        return paged_decode(q, k_cache, v_cache, meta, scale)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)  # contiguous
    if meta.num_decodes:
        out[: meta.num_decodes] = decode_attention(
            q[: meta.num_decodes], k_cache, v_cache, meta, scale
        )
    if meta.prefill_kernel is not None and meta.prefills:
        if meta.prefill_chunks is None:
            meta.prefill_chunks = prefill_chunks(meta.prefills, meta.slot_mapping)
        meta.prefill_kernel.many(q, k_cache, v_cache, meta.prefill_chunks, scale, out)
        return out
    for seg in meta.prefills:
        rows = slice(seg.query_start, seg.query_start + seg.query_len)
        if meta.prefill_softmax is not None:
            out[rows] = prefill_matmul(
                q[rows], k[rows], v[rows], k_cache, v_cache, seg, scale, meta.prefill_softmax
            )
        else:
            out[rows] = prefill_sdpa(q[rows], k[rows], v[rows], k_cache, v_cache, seg, scale)
    return out


def prefill_chunks(segments: list[PrefillSegment], slot_mapping: torch.Tensor) -> PrefillChunks:
    """The chunks as the prefill kernel takes them, each with the slots of every key its queries
    see: its own (from the step's `slot_mapping`), after any earlier tokens'."""
    return PrefillChunks.build(
        [(s.query_start, s.query_len, s.num_computed, _context_slots(s, slot_mapping))
         for s in segments]
    )  # fmt: skip


def _context_slots(seg: PrefillSegment, slot_mapping: torch.Tensor) -> torch.Tensor:
    if seg.context_slots is not None:
        return seg.context_slots
    return slot_mapping[seg.query_start : seg.query_start + seg.query_len]


def decode_attention(
    q: torch.Tensor,  # [num_decodes, num_heads, head_dim]
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
) -> torch.Tensor:  # [num_decodes, num_heads, head_dim]
    """Every decode row against its own context, by meta.decode_backend."""
    assert meta.decode_tables is not None
    if meta.decode_backend == "native":
        if meta.decode_context_lens is None:
            meta.decode_context_lens = torch.tensor(meta.decode_lengths, dtype=torch.long)
        return native_paged_decode()(
            q, k_cache, v_cache, meta.decode_tables, meta.decode_context_lens,
            meta.block_size, scale,
        )  # fmt: skip
    groups = decode_groups(meta)
    out = torch.empty_like(q) if len(groups) > 1 else None
    for group in groups:
        keys = _gather_blocks(k_cache, group, meta.block_size)  # [kv_heads, rows, ctx, head_dim]
        values = _gather_blocks(v_cache, group, meta.block_size)
        query = q.index_select(0, group.rows)  # [rows, num_heads, head_dim]
        attend = decode_matmul if meta.decode_backend == "matmul" else decode_sdpa
        result = attend(query, keys, values, group.mask, scale)  # [rows, num_heads, head_dim]
        if out is None:
            # One group holds every row, in length order: put them back in batch order.
            return torch.empty_like(result).index_copy_(0, group.rows, result)
        out.index_copy_(0, group.rows, result)
    assert out is not None
    return out


def _gather_blocks(cache: torch.Tensor, group: DecodeGroup, block_size: int) -> torch.Tensor:
    """[kv_heads, rows, num_blocks * block_size, head_dim]: each row's blocks, in order."""
    kv_heads, num_slots, head_dim = cache.shape
    by_block = cache.view(kv_heads, num_slots // block_size, block_size * head_dim)
    # index_select is several times faster than advanced indexing for row gathers on CPU.
    gathered = by_block.index_select(1, group.blocks)  # [kv_heads, rows * blocks, bs * head_dim]
    return gathered.view(kv_heads, group.rows.shape[0], -1, head_dim)


def decode_sdpa(
    query: torch.Tensor,  # [rows, num_heads, head_dim]
    keys: torch.Tensor,  # [kv_heads, rows, ctx, head_dim]
    values: torch.Tensor,  # [kv_heads, rows, ctx, head_dim]
    mask: torch.Tensor,  # [rows, ctx] bool, True = attend
    scale: float,
) -> torch.Tensor:  # [rows, num_heads, head_dim]
    return F.scaled_dot_product_attention(
        query.unsqueeze(2),  # [rows, num_heads, 1, head_dim]
        keys.transpose(0, 1),  # [rows, kv_heads, ctx, head_dim]
        values.transpose(0, 1),
        attn_mask=mask[:, None, None, :],  # [rows, 1, 1, ctx]
        scale=scale,
        enable_gqa=True,
    ).squeeze(2)


def decode_matmul(
    query: torch.Tensor,  # [rows, num_heads, head_dim]
    keys: torch.Tensor,  # [kv_heads, rows, ctx, head_dim]
    values: torch.Tensor,  # [kv_heads, rows, ctx, head_dim]
    mask: torch.Tensor,  # [rows, ctx] bool, True = attend
    scale: float,
) -> torch.Tensor:  # [rows, num_heads, head_dim]
    """One query row per sequence as two batched matmuls per KV head group, softmax in float32
    (the eager attention of transformers). On an AVX512-BF16 CPU without AMX, SDPA's flash
    kernel handles a single query row poorly: for 16 rows x 300 keys it took 8 ms in bf16 where
    this takes 1.3 ms (AMD EPYC, one thread); on an AMX Xeon SDPA was the faster one. The query
    heads sharing a KV head multiply together, so grouped-query attention repeats no keys."""
    rows, num_heads, head_dim = query.shape
    kv_heads = keys.shape[0]
    # [kv_heads, rows, group, head_dim]: query heads h * group .. h * group + group - 1 share h
    grouped = query.view(rows, kv_heads, num_heads // kv_heads, head_dim).transpose(0, 1)
    scores = torch.matmul(grouped, keys.transpose(-1, -2)).float()  # [kv, rows, group, ctx]
    scores.mul_(scale).masked_fill_(mask.logical_not()[None, :, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1).to(values.dtype)
    out = torch.matmul(probs, values)  # [kv_heads, rows, group, head_dim]
    return out.transpose(0, 1).reshape(rows, num_heads, head_dim)


def _chunk_keys(
    k: torch.Tensor,  # [query_len, num_kv_heads, head_dim]
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    seg: PrefillSegment,
) -> tuple[torch.Tensor, torch.Tensor]:  # each [kv_heads, context_len, head_dim]
    """The keys and values a prefill chunk attends to: its own when nothing was cached before
    it (views, no copy), else its sequence's whole context gathered from the cache."""
    if seg.context_slots is None:
        return k.transpose(0, 1), v.transpose(0, 1)
    return (
        k_cache.index_select(1, seg.context_slots),
        v_cache.index_select(1, seg.context_slots),
    )


def prefill_sdpa(
    q: torch.Tensor,  # [query_len, num_heads, head_dim]
    k: torch.Tensor,  # [query_len, num_kv_heads, head_dim]
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    seg: PrefillSegment,
    scale: float,
) -> torch.Tensor:  # [query_len, num_heads, head_dim]
    """A prefill chunk's attention by PyTorch's SDPA: causal within a fresh chunk, masked over
    the gathered context after tokens already cached."""
    query = q.transpose(0, 1).unsqueeze(0)  # [1, num_heads, query_len, head_dim]
    keys, values = _chunk_keys(k, v, k_cache, v_cache, seg)
    key, value = keys.unsqueeze(0), values.unsqueeze(0)  # [1, kv_heads, ctx, head_dim]
    if seg.context_slots is None:
        # Nothing cached before this chunk: attend within it, causally.
        out = F.scaled_dot_product_attention(
            query, key, value, is_causal=True, scale=scale, enable_gqa=True
        )
    else:
        query_pos = torch.arange(seg.num_computed, seg.context_len, device=q.device)
        key_pos = torch.arange(seg.context_len, device=q.device)
        mask = key_pos[None, :] <= query_pos[:, None]  # [query_len, ctx]
        out = F.scaled_dot_product_attention(
            query, key, value, attn_mask=mask, scale=scale, enable_gqa=True
        )
    return out.squeeze(0).transpose(0, 1)  # [query_len, num_heads, head_dim]


def prefill_matmul(
    q: torch.Tensor,  # [query_len, num_heads, head_dim]
    k: torch.Tensor,  # [query_len, num_kv_heads, head_dim]
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    seg: PrefillSegment,
    scale: float,
    softmax: NativeLayer,
) -> torch.Tensor:  # [query_len, num_heads, head_dim]
    """A prefill chunk's attention as decode_matmul computes a decode row's: scores by a matmul
    in the activations' dtype, the causal softmax in float32 in one native pass
    (kernels/cpu/native/layer.cpp), probabilities rounded to the dtype, then a matmul with the values;
    the eager attention of transformers. On an AVX512-BF16 CPU the two bf16 matmuls are
    oneDNN's, several times faster than SDPA's flash kernel on the same chunk (a 512-token
    chunk, 12 heads: 5.5 ms there). The query heads sharing a KV head multiply together, so
    grouped-query attention repeats no keys; the full square of scores is computed and the
    softmax zeroes what a query may not see."""
    query_len, num_heads, head_dim = q.shape
    kv_heads = k.shape[1]
    group = num_heads // kv_heads
    keys, values = _chunk_keys(k, v, k_cache, v_cache, seg)  # [kv_heads, ctx, head_dim]
    # [kv_heads, group * query_len, head_dim]: head h * group + g's queries, in order
    grouped = q.view(query_len, kv_heads, group, head_dim).permute(1, 2, 0, 3)
    grouped = grouped.reshape(kv_heads, group * query_len, head_dim)
    scores = torch.matmul(grouped, keys.transpose(1, 2))  # [kv_heads, group * query_len, ctx]
    softmax.causal_softmax(
        scores.view(-1, scores.shape[-1]),
        query_len=query_len,
        offset=seg.num_computed,
        scale=scale,
    )
    out = torch.matmul(scores, values)  # [kv_heads, group * query_len, head_dim]
    out = out.view(kv_heads, group, query_len, head_dim).permute(2, 0, 1, 3)
    return out.reshape(query_len, num_heads, head_dim)
