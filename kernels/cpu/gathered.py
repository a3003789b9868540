"""The CPU path's kernel for rows whose adapters each cover only a few rows (decode rows over
many adapters): every row multiplies by its own slot's weights, read in place.

    y[t]        = round(x[rows[t]] @ A[slot[t]].T)                      [n R]
    delta[t, c] = sum_k<r_t  y[t, i r_t + k] * B[slot[t], i r_t + k, c]  c in sub i's columns
    out[rows[t]] += delta[t]

(A fused stack holds n sub-projections; a slot of adapter rank r_t keeps sub i's rank rows at
[i r_t, i r_t + r_t), lora/layers.py.) Written as element-wise products and sums over gathered
indices, so inductor emits one C++ loop nest per sub-projection that reads A[slot[t]] and the
slot's B block where they lie: no copy of a slot's weights, no zero block of a fused B, no slot
that no row uses. The padded `bmm` it replaced read every slot between the lowest and highest
used one, zeros included: with 1,000 adapters in 64 slots, a 34-row decode step read ~500 MB of
adapter weights instead of ~150 (bench/RESULTS.md).

What runs on the engine's step is the hand-written C++ of the same function
(kernels/cpu/native/rows.cpp via kernels/cpu/rows.py, ~1.9x faster on a 34-row decode step over 28
adapters); this one is its statement of semantics, the test oracle beside the float64 one, and
the fallback: compiled by inductor where the C++ build fails or lacks the dtype, eager PyTorch
where nothing compiles (correct, but it materialises the gathers: T copies of a slot's weights).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import torch

# (first output column, width) of each sub-projection fused into one stack, in order.
SubOutputs = Sequence[tuple[int, int]]
GatheredKernel = Callable[..., None]


def gathered_rows(
    x: torch.Tensor,  # [num_tokens, in]
    out: torch.Tensor,  # [num_tokens, out_features], updated in place (may be a strided view)
    rows: torch.Tensor,  # [T] long: the rows this kernel covers
    slots: torch.Tensor,  # [T] long: each row's slot
    lora_a: torch.Tensor,  # [S, n * R, in]
    lora_b_rows: torch.Tensor,  # [S, n * R, out_features]: B with its rank dimension first
    slot_ranks: torch.Tensor,  # [S] int32: n * the slot's adapter rank (0 = empty)
    subs: tuple[tuple[int, int], ...],
    rank: int,  # R: the stacks' per-sub-projection rank width
) -> None:
    n = len(subs)
    a = lora_a[slots].float()  # [T, nR, in], fused into the reduction below when compiled
    # y rounded to the activations' dtype between the products, as the long-run path and a
    # PEFT model in that dtype do
    y = (x[rows].float()[:, None, :] * a).sum(-1).to(x.dtype).float()  # [T, nR]
    row_rank = (slot_ranks[slots] // n)[:, None]  # [T, 1]
    k = torch.arange(rank, device=x.device)[None, :]  # [1, R]
    valid = k < row_rank  # [T, R]
    parts = []
    for i, (offset, width) in enumerate(subs):
        kk = torch.where(valid, i * row_rank + k, 0)  # [T, R]: sub i's rank rows of the slot
        b = lora_b_rows[slots[:, None], kk, offset : offset + width].float()  # [T, R, width]
        # where, not a multiply by the mask: beyond a slot's rank anything may lie (even NaN)
        products = torch.where(valid[:, :, None], y.gather(1, kk)[:, :, None] * b, 0.0)
        parts.append(products.sum(1))  # [T, width]
    delta = torch.cat(parts, 1)  # [T, out_features]
    # One rounding of out + delta; the scatter is part of the compiled kernel (a separate
    # index_copy_ per projection cost ~7% of the LoRA time of a 34-row decode step)
    out.index_put_((rows,), (out[rows].float() + delta).to(out.dtype))


@functools.cache
def compiled_gathered_rows() -> GatheredKernel:
    """`gathered_rows` under torch.compile: one graph per sub-projection count (1, 2, 3) and
    dtype (and grad mode: the engine steps in inference mode); rows, slots, ranks and widths are
    dynamic, so every model and batch size shares it. Compiles on first call (a few seconds;
    inductor caches the C++ on disk)."""
    return torch.compile(gathered_rows, dynamic=True)


def warm_up(
    kernel: GatheredKernel,
    stacks: Sequence[tuple[torch.Tensor, torch.Tensor, SubOutputs]],
) -> None:
    """Run `kernel` once per distinct sub-projection count in `stacks` ((lora_a, lora_b_rows,
    sub_outputs) of each wrapper): the compile happens at start-up, not on a request's step.
    Raises what the compiler raises."""
    seen: set[int] = set()
    for lora_a, lora_b_rows, sub_outputs in stacks:
        n = len(sub_outputs)
        if n in seen:
            continue
        seen.add(n)
        rows = torch.arange(2, device=lora_a.device)  # two rows: a size-1 dim is specialised
        x = torch.zeros(2, lora_a.shape[2], dtype=lora_a.dtype, device=lora_a.device)
        out = torch.zeros(2, lora_b_rows.shape[2], dtype=lora_a.dtype, device=lora_a.device)
        ranks = torch.zeros(lora_a.shape[0], dtype=torch.int32, device=lora_a.device)
        with torch.inference_mode():
            kernel(
                x,
                out,
                rows,
                torch.zeros_like(rows),  # both rows on slot 0
                lora_a,
                lora_b_rows,
                ranks,
                tuple(sub_outputs),
                lora_a.shape[1] // n,
            )
