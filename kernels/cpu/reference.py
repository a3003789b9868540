"""PyTorch reference of the LoRA kernels, and the CPU path of ``kernels.triton.ops``.

Grouped per run of one adapter slot (``meta.segments``, host-side): one matmul pair per run,
never a loop over tokens, and no gather or scatter: a run is a plain row slice. The segmented
and gathered forms differ only in how a kernel finds a token's slot, so the reference serves
both.

``lora_shrink_ref`` / ``lora_expand_ref`` are the exact semantics (float32 products), against
which the Triton kernels are tested. ``lora_add_cpu`` is what runs on CPU: long runs grouped
the same way, with both products in the activations' dtype fused into an in-place ``addmm_``,
and the rows of short runs in one gathered kernel call; or, where the C kernel takes it (bf16
on AVX512-BF16 or AVX2 + FMA), every run in one call of its tiled form (kernels/cpu/native/lora_runs.h).
"""

from __future__ import annotations

import torch

from kernels.cpu import onednn
from kernels.cpu.gathered import GatheredKernel, SubOutputs
from kernels.cpu.plan import DENSE_RUN_MAX, plan_cpu
from kernels.cpu.rows import default_rows_kernel
from kernels.triton.meta import LoRAKernelMeta


def lora_shrink_ref(x: torch.Tensor, lora_a: torch.Tensor, meta: LoRAKernelMeta) -> torch.Tensor:
    """``out[t] = x[t] @ lora_a[slot[t], :rank[slot[t]]].T``, zero beyond the rank and for slot -1.

    x: [num_tokens, in_features], any float dtype.
    lora_a: [num_slots, max_rank, in_features], any float dtype.
    Returns [num_tokens, max_rank] float32 (products accumulated in float32).
    """
    out = torch.zeros(meta.num_tokens, meta.max_rank, dtype=torch.float32, device=x.device)
    for start, end, slot in meta.segments:
        rank = meta.ranks[slot]
        if rank:
            a = lora_a[slot, :rank].float()  # [rank, in_features]
            out[start:end, :rank] = x[start:end].float() @ a.T
    return out


def lora_expand_ref(
    y: torch.Tensor, lora_b: torch.Tensor, meta: LoRAKernelMeta, out: torch.Tensor
) -> None:
    """``out[t] += (y[t, :rank] @ lora_b[slot[t], :, :rank].T).to(out.dtype)``; slot -1 untouched.

    y: [num_tokens, max_rank] float32 (the shrink output).
    lora_b: [num_slots, out_features, max_rank], any float dtype, scale already folded in.
    out: [num_tokens, out_features], any float dtype, updated in place; may be a strided view
    (a column slice of a fused projection output).
    """
    for start, end, slot in meta.segments:
        rank = meta.ranks[slot]
        if rank:
            b = lora_b[slot, :, :rank].float()  # [out_features, rank]
            out[start:end] += (y[start:end, :rank].float() @ b.T).to(out.dtype)


def lora_add_cpu(
    x: torch.Tensor,
    lora_a: torch.Tensor,
    lora_b: torch.Tensor,
    meta: LoRAKernelMeta,
    out: torch.Tensor,
    sub_outputs: SubOutputs | None = None,
    *,
    cpu_gathered: GatheredKernel | None = None,
) -> None:
    """``lora_expand_ref(lora_shrink_ref(x, lora_a, meta), lora_b, meta, out)`` computed in the
    inputs' dtype: x, lora_a, lora_b and out share one dtype.

    Where the kernel has ``run_segments`` and it takes the call (the C kernel in bf16 on
    AVX512-BF16 or AVX2 + FMA), every run, long and short, goes there in one call. Otherwise, per long run:
    ``y = x[run] @ A.T`` and ``out[run].addmm_(y, B.T)``, two BLAS calls and no
    temporary of the output's width; the rows of the short runs go to one call of the gathered
    kernel (kernels/cpu/plan.py, kernels/cpu/gathered.py; ``cpu_gathered``, default the C one of
    kernels/cpu/rows.py, else the compiled one). In float32 this is the reference up to
    summation order. In bfloat16 the products run with float32 accumulation, and y is rounded
    to bfloat16 between the two, as a bf16 PEFT model does. Converting to float32 instead (the reference) made LoRA cost more than the base
    matmuls it rides on. ``lora_b`` stored as a transposed view of a contiguous [num_slots,
    max_rank, out_features] stack (lora/layers.py on CPU) makes every B operand here a plain
    view.

    ``sub_outputs``: the stacks fuse n sub-projections block-diagonally (lora/layers.py: a slot
    of rank n * r holds sub i's rank columns at [i * r, i * r + r) and its output columns at
    sub_outputs[i]); both paths then multiply only the non-zero blocks (n times fewer FLOPs and
    bytes of B).
    """
    plan = meta.cpu if meta.cpu is not None else plan_cpu(meta.segments, meta.ranks, x.device)
    subs = tuple(sub_outputs) if sub_outputs is not None and len(sub_outputs) > 1 else None
    kernel = cpu_gathered if cpu_gathered is not None else default_rows_kernel()
    n = len(subs) if subs is not None else 1
    every_sub = subs if subs is not None else ((0, out.shape[1]),)
    run_segments = getattr(kernel, "run_segments", None)  # the C kernel's tiles of runs
    if run_segments is not None and run_segments(
        x, out, plan.segments, lora_a, lora_b.transpose(1, 2), meta.slot_ranks, every_sub,
        meta.max_rank // n,
    ):  # fmt: skip
        return
    # no oneDNN bf16 (AVX2): the long runs multiply in float32, rounded as the bf16 calls round
    widen = x.dtype is torch.bfloat16 and not onednn.has_bf16()
    for start, end, slot in plan.runs:
        rank = meta.ranks[slot]
        y = _mm(x[start:end], lora_a[slot, :rank].T, widen)  # [rows, rank]
        # a lone short run keeps one fused expand: n small calls would cost more than zeros
        if subs is None or end - start <= DENSE_RUN_MAX:
            _addmm_(out[start:end], y, lora_b[slot, :, :rank].T, widen)
            continue
        r = rank // len(subs)
        for i, (offset, width) in enumerate(subs):
            b = lora_b[slot, offset : offset + width, i * r : i * r + r]  # [width, r]
            _addmm_(out[start:end, offset : offset + width], y[:, i * r : i * r + r], b.T, widen)
    if plan.gathered is not None:
        kernel(
            x,
            out,
            plan.gathered.rows,
            plan.gathered.slots,
            lora_a,
            lora_b.transpose(1, 2),  # [S, n R, out]: a plain view of the CPU storage
            meta.slot_ranks,
            every_sub,
            meta.max_rank // n,
        )


def _mm(a: torch.Tensor, b: torch.Tensor, widen: bool) -> torch.Tensor:
    """a @ b, in a's dtype: float32 sums, one rounding (widened: the same, by float32 BLAS)."""
    if not widen:
        return a @ b
    return (a.float() @ b.float()).to(a.dtype)


def _addmm_(c: torch.Tensor, a: torch.Tensor, b: torch.Tensor, widen: bool) -> None:
    """c += a @ b in place, one rounding of the sum (c may be a strided view)."""
    if not widen:
        c.addmm_(a, b)
        return
    c.copy_(torch.addmm(c.float(), a.float(), b.float()))
