"""Decode attention that reads the paged KV cache through the block table, for the compiled path.

Semantics, as the eager path computes them (engine/step/attention.py, `decode_matmul`):

    keys[kv, b, t]  = k_cache[kv, block_tables[b, t // block_size] * block_size + t % block_size]
    scores          = (q grouped by KV head) . keys * scale, float32, masked to t < context_lens[b]
    out[b, h]       = softmax(scores) . values

Written as products and sums rather than gather + matmul on purpose: under torch.compile,
inductor turns `k_cache[:, token_slots]` followed by a reduction into one C++ loop that loads
each key through the index, so no [kv_heads, rows, context, head_dim] copy is ever made (the
eager path's gather). Eager PyTorch would materialise every intermediate here; this function is
meant to run compiled only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class DecodeMetadata:
    """A decode-only step as plain tensors (what the compiled forward takes; no Python lists,
    so one compiled graph serves every step of a batch size)."""

    slot_mapping: torch.Tensor  # [rows] long: where each row's new K/V is written
    block_tables: torch.Tensor  # [rows, max_blocks] long (padding -> the scratch block)
    context_lens: torch.Tensor  # [rows] long: context length, this step's token included
    block_size: int
    # attend by the hand-written kernel (kernels/cpu/attention.py, an opaque operator in the
    # graph) rather than by the function below
    native: bool = False


def paged_decode(
    q: torch.Tensor,  # [rows, num_heads, head_dim]
    k_cache: torch.Tensor,  # [num_kv_heads, num_slots, head_dim]
    v_cache: torch.Tensor,  # [num_kv_heads, num_slots, head_dim]
    meta: DecodeMetadata,
    scale: float,
) -> torch.Tensor:  # [rows, num_heads, head_dim]
    rows, num_heads, head_dim = q.shape
    kv_heads = k_cache.shape[0]
    group = num_heads // kv_heads
    block_size = meta.block_size
    context = meta.block_tables.shape[1] * block_size
    offsets = torch.arange(block_size, device=q.device)
    token_slots = (meta.block_tables[:, :, None] * block_size + offsets).reshape(rows, context)
    keys = k_cache[:, token_slots]  # [kv_heads, rows, context, head_dim], fused away compiled
    values = v_cache[:, token_slots]
    # [kv_heads, rows, group, head_dim]: query heads h * group .. h * group + group - 1 share h
    grouped = q.view(rows, kv_heads, group, head_dim).transpose(0, 1).float()
    scores = (grouped[:, :, :, None, :] * keys[:, :, None, :, :].float()).sum(-1)
    scores = scores * scale  # [kv_heads, rows, group, context]
    is_past = torch.arange(context, device=q.device)[None, :] < meta.context_lens[:, None]
    scores = scores.masked_fill(~is_past[None, :, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    out = (probs[..., None] * values[:, :, None, :, :].float()).sum(-2)  # [kv, rows, group, hd]
    return out.transpose(0, 1).reshape(rows, num_heads, head_dim).to(q.dtype)
