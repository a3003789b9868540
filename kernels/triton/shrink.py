"""Triton LoRA shrink: ``out[t] = x[t] @ lora_a[slot[t], :rank[slot[t]]].T`` (float32 out).

Shapes: x [num_tokens, in_features], lora_a [num_slots, max_rank, in_features], out
[num_tokens, max_rank]. Two forms compute the same thing and differ in how a program finds its
slot: segmented programs own a tile of one run of equal slots (prefill), gathered programs own
one token and read its slot (decode). Rank tiles at or past the slot's rank are skipped, so a
rank-8 adapter in a stack padded to 64 computes one 16-wide rank tile, not four.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.triton.meta import LoRAForm, LoRAKernelMeta


@triton.jit
def _shrink_segmented_kernel(
    x_ptr,  # [num_tokens, in_features]
    a_ptr,  # [num_slots, max_rank, in_features]
    out_ptr,  # [num_tokens, max_rank] float32, zero-filled
    seg_starts_ptr,  # [num_segments + 1] int32
    seg_slots_ptr,  # [num_segments] int32
    slot_ranks_ptr,  # [num_slots] int32
    in_features,
    stride_xm,
    stride_as,
    stride_ar,
    stride_om,
    BLOCK_M: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """``out[m, r0:r0+BLOCK_R] = x[m] @ a[slot, r0:r0+BLOCK_R].T`` for one tile of one segment."""
    seg = tl.program_id(0)
    start = tl.load(seg_starts_ptr + seg)
    end = tl.load(seg_starts_ptr + seg + 1)
    m0 = start + tl.program_id(1) * BLOCK_M
    slot = tl.load(seg_slots_ptr + seg)
    if (m0 >= end) | (slot < 0):
        return
    rank = tl.load(slot_ranks_ptr + slot)
    r0 = tl.program_id(2) * BLOCK_R
    if r0 >= rank:
        return

    offs_m = m0 + tl.arange(0, BLOCK_M)  # [BLOCK_M]
    offs_r = r0 + tl.arange(0, BLOCK_R)  # [BLOCK_R]
    offs_k = tl.arange(0, BLOCK_K)  # [BLOCK_K]
    mask_m = offs_m < end
    mask_r = offs_r < rank
    x_rows = x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm  # [BLOCK_M, 1]
    a_rows = a_ptr + slot.to(tl.int64) * stride_as + offs_r[:, None] * stride_ar  # [BLOCK_R, 1]
    acc = tl.zeros((BLOCK_M, BLOCK_R), dtype=tl.float32)
    for k0 in range(0, in_features, BLOCK_K):
        mask_k = (k0 + offs_k) < in_features
        x = tl.load(
            x_rows + k0 + offs_k[None, :], mask=mask_m[:, None] & mask_k[None, :], other=0.0
        )
        a = tl.load(
            a_rows + k0 + offs_k[None, :], mask=mask_r[:, None] & mask_k[None, :], other=0.0
        )
        # float32 tiles and IEEE products: the same numbers as the float32 reference (no TF32).
        acc += tl.dot(x.to(tl.float32), tl.trans(a.to(tl.float32)), input_precision="ieee")
    out = out_ptr + offs_m.to(tl.int64)[:, None] * stride_om + offs_r[None, :]
    tl.store(out, acc, mask=mask_m[:, None] & mask_r[None, :])


@triton.jit
def _shrink_gathered_kernel(
    x_ptr,  # [num_tokens, in_features]
    a_ptr,  # [num_slots, max_rank, in_features]
    out_ptr,  # [num_tokens, max_rank] float32, zero-filled
    token_slots_ptr,  # [num_tokens] int32
    slot_ranks_ptr,  # [num_slots] int32
    in_features,
    stride_xm,
    stride_as,
    stride_ar,
    stride_om,
    BLOCK_R: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """``out[t, r0:r0+BLOCK_R] = x[t] @ a[token_slots[t], r0:r0+BLOCK_R].T`` for one token."""
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(token_slots_ptr + t)
    if slot < 0:
        return
    rank = tl.load(slot_ranks_ptr + slot)
    r0 = tl.program_id(1) * BLOCK_R
    if r0 >= rank:
        return

    offs_r = r0 + tl.arange(0, BLOCK_R)  # [BLOCK_R]
    offs_k = tl.arange(0, BLOCK_K)  # [BLOCK_K]
    mask_r = offs_r < rank
    a_rows = a_ptr + slot.to(tl.int64) * stride_as + offs_r[:, None] * stride_ar  # [BLOCK_R, 1]
    # One row is below tl.dot's minimum tile, so the product is a broadcast multiply and a sum.
    acc = tl.zeros((BLOCK_R,), dtype=tl.float32)
    for k0 in range(0, in_features, BLOCK_K):
        mask_k = (k0 + offs_k) < in_features
        x = tl.load(x_ptr + t * stride_xm + k0 + offs_k, mask=mask_k, other=0.0)
        a = tl.load(
            a_rows + k0 + offs_k[None, :], mask=mask_r[:, None] & mask_k[None, :], other=0.0
        )
        acc += tl.sum(a.to(tl.float32) * x.to(tl.float32)[None, :], axis=1)
    tl.store(out_ptr + t * stride_om + offs_r, acc, mask=mask_r)


_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def lora_shrink_triton(
    x: torch.Tensor,
    lora_a: torch.Tensor,
    meta: LoRAKernelMeta,
    *,
    form: LoRAForm,
) -> torch.Tensor:
    """``out[t] = x[t] @ lora_a[slot[t], :rank[slot[t]]].T``, zero beyond the rank and for slot -1.

    x: [num_tokens, in_features] float16/bfloat16/float32, rows may be strided, last dim contiguous.
    lora_a: [num_slots, max_rank, in_features], contiguous, same dtype as x.
    meta: built for these tokens and slots, on x's device.
    Returns [num_tokens, max_rank] float32. Raises ValueError naming the argument on a mismatch.
    """
    if x.dim() != 2:
        raise ValueError(f"x must be [num_tokens, in_features], got shape {tuple(x.shape)}")
    if lora_a.dim() != 3:
        raise ValueError(
            f"lora_a must be [num_slots, max_rank, in_features], got shape {tuple(lora_a.shape)}"
        )
    num_tokens, in_features = x.shape
    num_slots, max_rank, a_in_features = lora_a.shape
    if a_in_features != in_features:
        raise ValueError(f"lora_a has in_features {a_in_features}, x has {in_features}")
    if x.dtype not in _FLOAT_DTYPES:
        raise ValueError(f"x must be float16, bfloat16 or float32, got {x.dtype}")
    if lora_a.dtype != x.dtype:
        raise ValueError(f"lora_a dtype {lora_a.dtype} differs from x dtype {x.dtype}")
    if x.stride(1) != 1:
        raise ValueError("x must be contiguous along in_features (stride(1) == 1)")
    if not lora_a.is_contiguous():
        raise ValueError("lora_a must be contiguous")
    if lora_a.device != x.device:
        raise ValueError(f"lora_a is on {lora_a.device}, x is on {x.device}")
    if form not in ("segmented", "gathered"):
        raise ValueError(f"form must be 'segmented' or 'gathered', got {form!r}")
    meta.check_for(num_tokens=num_tokens, num_slots=num_slots, max_rank=max_rank, device=x.device)

    out = torch.zeros(num_tokens, max_rank, dtype=torch.float32, device=x.device)  # [T, max_rank]
    if not meta.has_lora or max_rank == 0:
        return out
    block_r = 16  # tl.dot's minimum tile side; a rank-8 adapter idles half of one tile
    block_k = max(16, min(128, triton.next_power_of_2(in_features)))
    num_r_tiles = triton.cdiv(max_rank, block_r)
    common = (in_features, x.stride(0), lora_a.stride(0), lora_a.stride(1), out.stride(0))
    if form == "segmented":
        block_m = 32
        grid = (meta.num_segments, triton.cdiv(meta.max_segment_len, block_m), num_r_tiles)
        _shrink_segmented_kernel[grid](
            x, lora_a, out, meta.seg_starts, meta.seg_slots, meta.slot_ranks, *common,
            BLOCK_M=block_m, BLOCK_R=block_r, BLOCK_K=block_k,
        )  # fmt: skip
    else:
        _shrink_gathered_kernel[(num_tokens, num_r_tiles)](
            x, lora_a, out, meta.token_slots, meta.slot_ranks, *common,
            BLOCK_R=block_r, BLOCK_K=block_k,
        )  # fmt: skip
    return out
