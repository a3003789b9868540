"""Attention over the paged KV cache: the PyTorch path (CPU and CUDA).

Cache layout per layer: k_cache, v_cache as [num_blocks * block_size, num_kv_heads, head_dim];
token at position p of a sequence lives in slot block_table[p // block_size] * block_size +
p % block_size. The flat batch holds decode tokens first (one per sequence), then each prefill
chunk contiguously.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


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
    slots: torch.Tensor  # [num_rows * max_context] long, row-major
    mask: torch.Tensor  # [num_rows, 1, 1, max_context] bool
    max_context: int


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [num_tokens] long: where each new token's K/V is written
    num_decodes: int
    decode_slots: torch.Tensor | None  # [num_decodes, max_context] long (padding -> slot 0)
    decode_mask: torch.Tensor | None  # [num_decodes, 1, 1, max_context] bool, True = attend
    prefills: list[PrefillSegment]
    # Built on first use and shared by every layer of the step.
    decode_groups: list[DecodeGroup] | None = None


# A group grows while its longest context stays within this factor (plus a little slack) of its
# shortest: padded key reads stay under ~25% of the real ones, at a few extra SDPA calls.
GROUP_LENGTH_RATIO = 1.25
GROUP_LENGTH_SLACK = 32


def decode_groups(meta: AttentionMetadata) -> list[DecodeGroup]:
    if meta.decode_groups is not None:
        return meta.decode_groups
    assert meta.decode_slots is not None and meta.decode_mask is not None
    lengths = meta.decode_mask[:, 0, 0, :].sum(-1).tolist()  # [num_decodes]
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
        longest = int(lengths[rows[-1]])
        index = torch.tensor(rows, dtype=torch.long, device=meta.decode_slots.device)
        groups.append(
            DecodeGroup(
                rows=index,
                slots=meta.decode_slots[index, :longest].reshape(-1),
                mask=meta.decode_mask[index, :, :, :longest],
                max_context=longest,
            )
        )
        start = end
    meta.decode_groups = groups
    return groups


def paged_attention(
    q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    v: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    k_cache: torch.Tensor,  # [num_slots, num_kv_heads, head_dim]
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
    k_cache.index_copy_(0, meta.slot_mapping, k)
    v_cache.index_copy_(0, meta.slot_mapping, v)
    out = torch.empty_like(q)
    if meta.num_decodes:
        out[: meta.num_decodes] = _decode(q[: meta.num_decodes], k_cache, v_cache, meta, scale)
    for seg in meta.prefills:
        rows = slice(seg.query_start, seg.query_start + seg.query_len)
        out[rows] = _prefill(q[rows], k[rows], v[rows], k_cache, v_cache, seg, scale)
    return out


def _decode(
    q: torch.Tensor,  # [num_decodes, num_heads, head_dim]
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
) -> torch.Tensor:
    groups = decode_groups(meta)
    out = torch.empty_like(q) if len(groups) > 1 else None
    for group in groups:
        num_rows = group.rows.shape[0]
        kv_shape = (num_rows, group.max_context, *k_cache.shape[1:])
        keys = _gather(k_cache, group.slots).view(kv_shape)  # [rows, ctx, kv_heads, head_dim]
        values = _gather(v_cache, group.slots).view(kv_shape)
        query = q.index_select(0, group.rows)  # [rows, num_heads, head_dim]
        if q.device.type == "cpu":
            result = _decode_matmul(query, keys, values, group.mask, scale)
        else:
            result = F.scaled_dot_product_attention(
                query.unsqueeze(2),  # [rows, num_heads, 1, head_dim]
                keys.transpose(1, 2),  # [rows, kv_heads, ctx, head_dim]
                values.transpose(1, 2),
                attn_mask=group.mask,  # [rows, 1, 1, ctx]
                scale=scale,
                enable_gqa=True,
            ).squeeze(2)  # [rows, num_heads, head_dim]
        if out is None:
            # One group holds every row, in length order: put them back in batch order.
            return torch.empty_like(result).index_copy_(0, group.rows, result)
        out.index_copy_(0, group.rows, result)
    assert out is not None
    return out


def _decode_matmul(
    query: torch.Tensor,  # [rows, num_heads, head_dim]
    keys: torch.Tensor,  # [rows, ctx, kv_heads, head_dim]
    values: torch.Tensor,  # [rows, ctx, kv_heads, head_dim]
    mask: torch.Tensor,  # [rows, 1, 1, ctx] bool, True = attend
    scale: float,
) -> torch.Tensor:  # [rows, num_heads, head_dim]
    """One query row per sequence as two batched matmuls per KV head group, softmax in float32
    (the eager attention of transformers). On CPU, SDPA's flash kernel handles a single query
    row poorly: for 16 rows x 300 keys it took 8 ms in bf16 where this takes 1.3 ms (AMD EPYC,
    one thread), and it was no faster in float32. The query heads sharing a KV head multiply
    together, so grouped-query attention needs no repeated keys."""
    rows, num_heads, head_dim = query.shape
    kv_heads = keys.shape[2]
    grouped = query.view(rows, kv_heads, num_heads // kv_heads, head_dim)
    keys = keys.transpose(1, 2).contiguous()  # [rows, kv_heads, ctx, head_dim]
    values = values.transpose(1, 2).contiguous()
    scores = torch.matmul(grouped, keys.transpose(-1, -2)).float()  # [rows, kv_heads, group, ctx]
    scores.mul_(scale).masked_fill_(mask.logical_not(), float("-inf"))
    probs = torch.softmax(scores, dim=-1).to(values.dtype)
    return torch.matmul(probs, values).view(rows, num_heads, head_dim)


def _gather(cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    # index_select is several times faster than advanced indexing for row gathers on CPU.
    return cache.index_select(0, slots)  # [len(slots), kv_heads, head_dim]


def _prefill(
    q: torch.Tensor,  # [query_len, num_heads, head_dim]
    k: torch.Tensor,  # [query_len, num_kv_heads, head_dim]
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    seg: PrefillSegment,
    scale: float,
) -> torch.Tensor:
    query = q.transpose(0, 1).unsqueeze(0)  # [1, num_heads, query_len, head_dim]
    if seg.context_slots is None:
        # Nothing cached before this chunk: attend within it, causally.
        key = k.transpose(0, 1).unsqueeze(0)  # [1, kv_heads, query_len, head_dim]
        value = v.transpose(0, 1).unsqueeze(0)
        out = F.scaled_dot_product_attention(
            query, key, value, is_causal=True, scale=scale, enable_gqa=True
        )
    else:
        key = (
            k_cache[seg.context_slots].transpose(0, 1).unsqueeze(0)
        )  # [1, kv_heads, ctx, head_dim]
        value = v_cache[seg.context_slots].transpose(0, 1).unsqueeze(0)
        query_pos = torch.arange(seg.num_computed, seg.context_len, device=q.device)
        key_pos = torch.arange(seg.context_len, device=q.device)
        mask = key_pos[None, :] <= query_pos[:, None]  # [query_len, ctx]
        out = F.scaled_dot_product_attention(
            query, key, value, attn_mask=mask, scale=scale, enable_gqa=True
        )
    return out.squeeze(0).transpose(0, 1)  # [query_len, num_heads, head_dim]
