"""Per-step LoRA metadata: which adapter slot each token of the flat batch uses.

The flat batch holds decode tokens first (one per sequence), then each prefill chunk
contiguously; the runner puts the sequences of one adapter side by side within each. On an
accelerator the decode rows get the gathered form (a slot per sequence, in any order) and the
prefill rows the segmented form (a run of tokens per chunk). On the CPU one part covers the
whole batch: the grouped CPU path walks its runs of one adapter (meta.segments) as row slices,
skipping base-model rows, and the part's metadata is built once per step.
A batch in which no token uses an adapter gets no LoRABatch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from kernels.triton.meta import LoRAKernelMeta
from kernels.triton.ops import LoRAForm

NO_SLOT = -1


@dataclass(frozen=True)
class LoRAPart:
    rows: slice  # rows of the flat batch this part covers
    # metas[n - 1]: for a wrapper fusing n sub-projections (stacks of n * max_rank, a slot's
    # rank n * its adapter's rank); same tokens and slots in each
    metas: tuple[LoRAKernelMeta, ...]
    form: LoRAForm


@dataclass(frozen=True)
class LoRABatch:
    parts: tuple[LoRAPart, ...]
    num_tokens: int


def build_lora_batch(
    seq_slots: Sequence[int],
    seq_num_tokens: Sequence[int],
    *,
    num_decodes: int,
    slot_ranks: Sequence[int],
    max_rank: int,
    max_fused: int,
    device: torch.device,
    split_forms: bool | None = None,
) -> LoRABatch | None:
    """`seq_slots[i]` (NO_SLOT = base model) applies to the `seq_num_tokens[i]` tokens of the
    i-th scheduled sequence in flat-batch order; the first `num_decodes` are decodes.
    `split_forms` (default: off the CPU) gives decode and prefill rows a part each; otherwise
    one part covers every row."""
    if all(slot == NO_SLOT for slot in seq_slots):
        return None
    token_slots: list[int] = []
    for slot, num_tokens in zip(seq_slots, seq_num_tokens, strict=True):
        token_slots += [slot] * num_tokens
    num_tokens = len(token_slots)
    spans: list[tuple[int, int, LoRAForm]]
    if device.type != "cpu" if split_forms is None else split_forms:
        spans = [(0, num_decodes, "gathered"), (num_decodes, num_tokens, "segmented")]
    else:
        spans = [(0, num_tokens, "segmented")]
    parts = []
    for start, end, form in spans:
        rows = token_slots[start:end]
        if all(slot == NO_SLOT for slot in rows):
            continue
        meta = LoRAKernelMeta.build(rows, slot_ranks, max_rank, device)
        metas = [meta] + [meta.with_rank_factor(n) for n in range(2, max_fused + 1)]
        parts.append(LoRAPart(slice(start, end), tuple(metas), form))
    return LoRABatch(tuple(parts), num_tokens)
