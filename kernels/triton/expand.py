"""Triton LoRA expand: ``out[t] += (y[t, :rank] @ lora_b[slot[t], :, :rank].T).to(out.dtype)``.

Shapes: y [num_tokens, max_rank] float32, lora_b [num_slots, out_features, max_rank], out
[num_tokens, out_features]. Segmented programs own a tile of one run of equal slots (prefill);
gathered programs own one token (decode). The rank loop stops at the slot's rank, so padding in
the stack costs nothing, and programs of slot -1 return at once, leaving their rows untouched.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.triton.meta import LoRAForm, LoRAKernelMeta


@triton.jit
def _expand_segmented_kernel(
    y_ptr,  # [num_tokens, max_rank] float32
    b_ptr,  # [num_slots, out_features, max_rank]
    out_ptr,  # [num_tokens, out_features], updated in place
    seg_starts_ptr,  # [num_segments + 1] int32
    seg_slots_ptr,  # [num_segments] int32
    slot_ranks_ptr,  # [num_slots] int32
    out_features,
    stride_ym,
    stride_bs,
    stride_bn,
    stride_om,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_R: tl.constexpr,
):
    """``out[m, n0:n0+BLOCK_N] += y[m, :rank] @ b[slot, n0:n0+BLOCK_N, :rank].T`` for one tile."""
    seg = tl.program_id(0)
    start = tl.load(seg_starts_ptr + seg)
    end = tl.load(seg_starts_ptr + seg + 1)
    m0 = start + tl.program_id(1) * BLOCK_M
    slot = tl.load(seg_slots_ptr + seg)
    if (m0 >= end) | (slot < 0):
        return
    rank = tl.load(slot_ranks_ptr + slot)
    if rank == 0:
        return

    offs_m = m0 + tl.arange(0, BLOCK_M)  # [BLOCK_M]
    offs_n = tl.program_id(2) * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N]
    offs_r = tl.arange(0, BLOCK_R)  # [BLOCK_R]
    mask_m = offs_m < end
    mask_n = offs_n < out_features
    y_rows = y_ptr + offs_m.to(tl.int64)[:, None] * stride_ym  # [BLOCK_M, 1]
    b_rows = b_ptr + slot.to(tl.int64) * stride_bs + offs_n[:, None] * stride_bn  # [BLOCK_N, 1]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for r0 in range(0, rank, BLOCK_R):
        mask_r = (r0 + offs_r) < rank
        y = tl.load(
            y_rows + r0 + offs_r[None, :], mask=mask_m[:, None] & mask_r[None, :], other=0.0
        )
        b = tl.load(
            b_rows + r0 + offs_r[None, :], mask=mask_n[:, None] & mask_r[None, :], other=0.0
        )
        # float32 tiles and IEEE products: the same numbers as the float32 reference (no TF32).
        acc += tl.dot(y.to(tl.float32), tl.trans(b.to(tl.float32)), input_precision="ieee")
    out = out_ptr + offs_m.to(tl.int64)[:, None] * stride_om + offs_n[None, :]
    mask = mask_m[:, None] & mask_n[None, :]
    # As torch's `out += delta.to(out.dtype)`: round the delta, add in float32, round once more
    # (the explicit float32 add also sidesteps the interpreter's bf16 arithmetic on raw uint16).
    current = tl.load(out, mask=mask)
    delta = acc.to(current.dtype).to(tl.float32)
    tl.store(out, (current.to(tl.float32) + delta).to(current.dtype), mask=mask)


@triton.jit
def _expand_gathered_kernel(
    y_ptr,  # [num_tokens, max_rank] float32
    b_ptr,  # [num_slots, out_features, max_rank]
    out_ptr,  # [num_tokens, out_features], updated in place
    token_slots_ptr,  # [num_tokens] int32
    slot_ranks_ptr,  # [num_slots] int32
    out_features,
    stride_ym,
    stride_bs,
    stride_bn,
    stride_om,
    BLOCK_N: tl.constexpr,
    BLOCK_R: tl.constexpr,
):
    """``out[t, n0:n0+BLOCK_N] += y[t, :rank] @ b[token_slots[t], n0:n0+BLOCK_N, :rank].T``."""
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(token_slots_ptr + t)
    if slot < 0:
        return
    rank = tl.load(slot_ranks_ptr + slot)
    if rank == 0:
        return

    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)  # [BLOCK_N]
    offs_r = tl.arange(0, BLOCK_R)  # [BLOCK_R]
    mask_n = offs_n < out_features
    b_rows = b_ptr + slot.to(tl.int64) * stride_bs + offs_n[:, None] * stride_bn  # [BLOCK_N, 1]
    # One row is below tl.dot's minimum tile, so the product is a broadcast multiply and a sum.
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for r0 in range(0, rank, BLOCK_R):
        mask_r = (r0 + offs_r) < rank
        y = tl.load(y_ptr + t * stride_ym + r0 + offs_r, mask=mask_r, other=0.0)
        b = tl.load(
            b_rows + r0 + offs_r[None, :], mask=mask_n[:, None] & mask_r[None, :], other=0.0
        )
        acc += tl.sum(b.to(tl.float32) * y.to(tl.float32)[None, :], axis=1)
    out = out_ptr + t * stride_om + offs_n
    current = tl.load(out, mask=mask_n)
    delta = acc.to(current.dtype).to(tl.float32)
    tl.store(out, (current.to(tl.float32) + delta).to(current.dtype), mask=mask_n)


_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def lora_expand_triton(
    y: torch.Tensor,
    lora_b: torch.Tensor,
    meta: LoRAKernelMeta,
    out: torch.Tensor,
    *,
    form: LoRAForm,
) -> None:
    """``out[t] += (y[t, :rank] @ lora_b[slot[t], :, :rank].T).to(out.dtype)``; slot -1 untouched.

    y: [num_tokens, max_rank] float32 (the shrink output), last dim contiguous.
    lora_b: [num_slots, out_features, max_rank] float16/bfloat16/float32, contiguous.
    out: [num_tokens, out_features] float16/bfloat16/float32, updated in place; rows may be
    strided (a column slice of a fused output such as ``qkv[:, q_size:q_size + kv_size]``),
    the last dim must be contiguous.
    meta: built for these tokens and slots, on y's device.
    Raises ValueError naming the argument on a mismatch.
    """
    if y.dim() != 2:
        raise ValueError(f"y must be [num_tokens, max_rank], got shape {tuple(y.shape)}")
    if lora_b.dim() != 3:
        raise ValueError(
            f"lora_b must be [num_slots, out_features, max_rank], got shape {tuple(lora_b.shape)}"
        )
    if out.dim() != 2:
        raise ValueError(f"out must be [num_tokens, out_features], got shape {tuple(out.shape)}")
    num_tokens, max_rank = y.shape
    num_slots, out_features, b_rank = lora_b.shape
    if b_rank != max_rank:
        raise ValueError(f"lora_b has max_rank {b_rank}, y has {max_rank}")
    if tuple(out.shape) != (num_tokens, out_features):
        raise ValueError(
            f"out has shape {tuple(out.shape)}, expected {(num_tokens, out_features)} "
            "(y's tokens, lora_b's out_features)"
        )
    if y.dtype != torch.float32:
        raise ValueError(f"y must be float32 (the shrink output), got {y.dtype}")
    if lora_b.dtype not in _FLOAT_DTYPES:
        raise ValueError(f"lora_b must be float16, bfloat16 or float32, got {lora_b.dtype}")
    if out.dtype not in _FLOAT_DTYPES:
        raise ValueError(f"out must be float16, bfloat16 or float32, got {out.dtype}")
    if y.stride(1) != 1:
        raise ValueError("y must be contiguous along max_rank (stride(1) == 1)")
    if out.stride(1) != 1:
        raise ValueError("out must be contiguous along out_features (stride(1) == 1)")
    if not lora_b.is_contiguous():
        raise ValueError("lora_b must be contiguous")
    for name, tensor in (("lora_b", lora_b), ("out", out)):
        if tensor.device != y.device:
            raise ValueError(f"{name} is on {tensor.device}, y is on {y.device}")
    if form not in ("segmented", "gathered"):
        raise ValueError(f"form must be 'segmented' or 'gathered', got {form!r}")
    meta.check_for(num_tokens=num_tokens, num_slots=num_slots, max_rank=max_rank, device=y.device)

    if not meta.has_lora or max_rank == 0 or out_features == 0:
        return
    block_r = 16  # tl.dot's minimum tile side; a rank-8 adapter idles half of one tile
    common = (out_features, y.stride(0), lora_b.stride(0), lora_b.stride(1), out.stride(0))
    if form == "segmented":
        block_m, block_n = 32, 64
        grid = (
            meta.num_segments,
            triton.cdiv(meta.max_segment_len, block_m),
            triton.cdiv(out_features, block_n),
        )
        _expand_segmented_kernel[grid](
            y, lora_b, out, meta.seg_starts, meta.seg_slots, meta.slot_ranks, *common,
            BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_R=block_r,
        )  # fmt: skip
    else:
        block_n = 128
        _expand_gathered_kernel[(num_tokens, triton.cdiv(out_features, block_n))](
            y, lora_b, out, meta.token_slots, meta.slot_ranks, *common,
            BLOCK_N=block_n, BLOCK_R=block_r,
        )  # fmt: skip
