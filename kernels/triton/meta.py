"""Per-batch LoRA metadata shared by the reference and the Triton kernels.

Data layout (num_slots adapter slots, each stack padded to ``max_rank``)::

    token_slots  [t0 t1 t2 t3 t4 t5]   = [ 2  2  2 -1  0  0]     gathered form (decode)
    seg_starts   [s0 s1 s2 s3]         = [ 0  3  4  6]           segmented form (prefill):
    seg_slots    [g0 g1 g2]            = [ 2 -1  0]              tokens seg_starts[i]:seg_starts[i+1] use seg_slots[i]
    slot_ranks   [slot0 slot1 slot2]   = [ 8  0 16]              true rank per slot, 0 = empty
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Literal

import torch

from kernels.cpu.plan import CpuPlan, plan_cpu

# segmented: runs of tokens sharing a slot (prefill); gathered: one slot per token (decode).
LoRAForm = Literal["segmented", "gathered"]


# eq=False: the fields are tensors, whose == is elementwise; identity equality is what a cache wants.
@dataclass(frozen=True, eq=False)
class LoRAKernelMeta:
    """Which adapter slot each token uses, in two forms. Slot -1 = no adapter (base model).

    Build it with :meth:`build`; the host-side fields (``max_rank``, ``active_slots``,
    ``max_segment_len``) let launchers size their grids without reading the device tensors.
    """

    token_slots: torch.Tensor  # [num_tokens] int32, -1 = none (gathered / decode form)
    seg_starts: torch.Tensor  # [num_segments + 1] int32, token offsets (segmented / prefill form)
    seg_slots: torch.Tensor  # [num_segments] int32, slot of each run (-1 allowed)
    slot_ranks: torch.Tensor  # [num_slots] int32, true rank of each slot's adapter (0 = empty)
    max_rank: int  # the stacks' padded rank dimension
    active_slots: tuple[int, ...]  # distinct slots >= 0 present in the batch, ascending
    max_segment_len: int  # longest run of one slot (host-side, sizes the segmented grid)
    # Host-side copies for the CPU path, which loops over runs without reading device tensors:
    segments: tuple[tuple[int, int, int], ...]  # (start, end, slot) of each run with slot >= 0
    ranks: tuple[int, ...]  # = slot_ranks
    cpu: CpuPlan | None  # how the CPU path groups the runs (None off the CPU)

    def with_rank_factor(self, factor: int) -> LoRAKernelMeta:
        """The same tokens and slots for stacks of ``factor`` sub-projections: every rank and the
        padded rank dimension times ``factor`` (see lora/layers.py)."""
        ranks = tuple(factor * r for r in self.ranks)
        return dataclasses.replace(
            self,
            slot_ranks=torch.tensor(ranks, dtype=torch.int32).to(self.slot_ranks.device),
            max_rank=factor * self.max_rank,
            ranks=ranks,
        )

    @property
    def num_tokens(self) -> int:
        return int(self.token_slots.shape[0])

    @property
    def num_segments(self) -> int:
        return int(self.seg_slots.shape[0])

    @property
    def num_slots(self) -> int:
        return int(self.slot_ranks.shape[0])

    @property
    def has_lora(self) -> bool:
        """False when no token uses an adapter: callers skip LoRA work entirely."""
        return len(self.active_slots) > 0

    def check_for(
        self, *, num_tokens: int, num_slots: int, max_rank: int, device: torch.device
    ) -> None:
        """Raise ValueError naming the mismatch when this metadata does not fit a kernel's inputs."""
        if self.num_tokens != num_tokens:
            raise ValueError(
                f"meta.token_slots has {self.num_tokens} tokens, the input has {num_tokens}"
            )
        if self.num_slots != num_slots:
            raise ValueError(
                f"meta.slot_ranks has {self.num_slots} slots, the stack has {num_slots}"
            )
        if self.max_rank != max_rank:
            raise ValueError(
                f"meta.max_rank is {self.max_rank}, the stack's rank dimension is {max_rank}"
            )
        for name in ("token_slots", "seg_starts", "seg_slots", "slot_ranks"):
            tensor: torch.Tensor = getattr(self, name)
            if tensor.device != device:
                raise ValueError(f"meta.{name} is on {tensor.device}, the inputs are on {device}")
            if tensor.dtype != torch.int32 or not tensor.is_contiguous():
                raise ValueError(f"meta.{name} must be a contiguous int32 tensor")

    @staticmethod
    def build(
        token_slots: Sequence[int],
        slot_ranks: Sequence[int],
        max_rank: int,
        device: torch.device | str,
    ) -> LoRAKernelMeta:
        """Build every field from host lists; consecutive equal slots merge into one segment.

        Raises ValueError naming the argument when a slot is outside ``[-1, len(slot_ranks))``
        or a rank is outside ``[0, max_rank]``.
        """
        if max_rank < 0:
            raise ValueError(f"max_rank must be >= 0, got {max_rank}")
        ranks = [int(r) for r in slot_ranks]
        for slot, rank in enumerate(ranks):
            if not 0 <= rank <= max_rank:
                raise ValueError(f"slot_ranks[{slot}] = {rank} is outside [0, max_rank={max_rank}]")
        slots = [int(s) for s in token_slots]
        num_slots = len(ranks)
        for t, slot in enumerate(slots):
            if not -1 <= slot < num_slots:
                raise ValueError(f"token_slots[{t}] = {slot} is outside [-1, {num_slots})")

        starts: list[int] = []
        seg_slots: list[int] = []
        for t, slot in enumerate(slots):
            if not seg_slots or seg_slots[-1] != slot:
                starts.append(t)
                seg_slots.append(slot)
        starts.append(len(slots))
        max_segment_len = max((b - a for a, b in pairwise(starts)), default=0)

        segments = tuple(
            (start, end, slot)
            for (start, end), slot in zip(pairwise(starts), seg_slots, strict=True)
            if slot >= 0
        )
        device = torch.device(device)

        def as_tensor(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.int32).to(device)

        return LoRAKernelMeta(
            token_slots=as_tensor(slots),  # [num_tokens]
            seg_starts=as_tensor(starts),  # [num_segments + 1]
            seg_slots=as_tensor(seg_slots),  # [num_segments]
            slot_ranks=as_tensor(ranks),  # [num_slots]
            max_rank=int(max_rank),
            active_slots=tuple(sorted({s for s in slots if s >= 0})),
            max_segment_len=max_segment_len,
            segments=segments,
            ranks=tuple(ranks),
            cpu=plan_cpu(segments, ranks, device) if device.type == "cpu" else None,
        )
