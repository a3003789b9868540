"""Per-step LoRA metadata: which adapter slot each token of the flat batch uses.

The flat batch holds decode tokens first (one per sequence), then each prefill chunk
contiguously; the runner puts the sequences of one adapter side by side within each. On an
accelerator the decode rows get the gathered form (a slot per sequence, in any order) and the
prefill rows the segmented form (a run of tokens per chunk). On the CPU the kernels' grouped
reference runs, which ignores the form but pays per slot for gathering rows, scattering them
back (index_add_) and finding them; given one run of a single slot it takes plain slices
instead, so there each part is one run of one adapter (base-model rows get no part at all).
A batch in which no token uses an adapter gets no LoRABatch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from kernels.lora_meta import LoRAKernelMeta
from kernels.ops import LoRAForm

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
    each run of one adapter is a part."""
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
        spans = [(start, end, "segmented") for start, end in _runs(seq_slots, seq_num_tokens)]
    parts = []
    for start, end, form in spans:
        rows = token_slots[start:end]
        if all(slot == NO_SLOT for slot in rows):
            continue
        meta = LoRAKernelMeta.build(rows, slot_ranks, max_rank, device)
        metas = [meta]
        for n in range(2, max_fused + 1):
            ranks = torch.tensor([n * r for r in slot_ranks], dtype=torch.int32).to(device)
            metas.append(dataclasses.replace(meta, slot_ranks=ranks, max_rank=n * max_rank))
        parts.append(LoRAPart(slice(start, end), tuple(metas), form))
    return LoRABatch(tuple(parts), num_tokens)


def _runs(seq_slots: Sequence[int], seq_num_tokens: Sequence[int]) -> list[tuple[int, int]]:
    """[start, end) of each maximal run of rows sharing one adapter slot (base rows skipped)."""
    runs: list[tuple[int, int]] = []
    start = 0
    for i, (slot, num_tokens) in enumerate(zip(seq_slots, seq_num_tokens, strict=True)):
        end = start + num_tokens
        if slot != NO_SLOT:
            if runs and i > 0 and seq_slots[i - 1] == slot:
                runs[-1] = (runs[-1][0], end)
            else:
                runs.append((start, end))
        start = end
    return runs
