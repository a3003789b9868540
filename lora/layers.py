"""LoRA on the model's projections by composition: a wrapper holds the base nn.Linear and adds,
per token, the delta of that token's adapter slot.

A wrapper covers one base linear and the n sub-projections fused into it, in output order, e.g.
qkv_proj = (q_proj, k_proj, v_proj) with widths (q_size, kv_size, kv_size). Sub-projections of
one wrapper share their input, so one shrink serves them all, and one expand writes them all
through a block-diagonal B. For a slot whose adapter has rank r (its largest module rank):

    lora_a  [max_loras, n * max_rank, in_features]    rows [i*r, i*r + r_i) = sub i's A
    lora_b  [max_loras, out_features, n * max_rank]   [offset_i : offset_i + width_i,
                                                        i*r : i*r + r_i] = sub i's B (scaled)

everything else zero (a sub-projection the adapter does not target stays zero). The kernels see
the slot's rank as n * r. Two launches per wrapper instead of 2n: on CPU that halves the LoRA
time (it pays per call and per run of one adapter), on CUDA it halves the launches; the zero
blocks of B cost (n - 1) / n of the expand's small FLOPs.

Every wrapper of a model shares one LoRAStepContext; the model runner puts the step's LoRABatch
on it for the forward pass. No batch (no token uses an adapter): the base layer alone runs.

The pool in bytes. Every slot is max_rank wide, whatever the rank of the adapter in it, so a
slot costs `slot_num_bytes` (the sum of the two stacks' rows above, over every wrapper) and a
memory budget buys budget // that many slots (engine/step/lora_setup.py). A rank-aware allocator
(S-LoRA's unified paging) would fit more low-rank adapters in the same bytes, but the kernels
index one stacked tensor per projection by slot; fixed-width slots keep them as they are and
waste at most (max_rank - r) / max_rank of a rank-r adapter's slot.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from kernels.cpu import huge_pages
from kernels.cpu.gathered import GatheredKernel, compiled_gathered_rows, gathered_rows, warm_up
from kernels.cpu.native.build import NativeBuildError, NoCompilerError
from kernels.cpu.rows import native_rows
from kernels.triton.meta import LoRAKernelMeta
from kernels.triton.ops import lora_add
from lora.batch import LoRABatch, LoRAPart
from lora.dims import BaseModelDims
from lora.loader import LoadedAdapter

logger = logging.getLogger(__name__)


class LoRAStepContext:
    """Per-step LoRA state shared by every wrapper of one model (set by the runner), and the CPU
    path's short-run kernel (None: kernels' default; see warm_up_cpu)."""

    def __init__(self) -> None:
        self.batch: LoRABatch | None = None
        self.cpu_gathered: GatheredKernel | None = None


@dataclass(frozen=True)
class SubProjection:
    module: str  # PEFT short name, e.g. "k_proj"
    offset: int  # first output column inside the fused output
    width: int


class LoRALinear(nn.Module):
    def __init__(
        self,
        base: nn.Linear,
        subs: Sequence[SubProjection],
        *,
        max_loras: int,
        max_rank: int,
        context: LoRAStepContext,
    ):
        super().__init__()
        self.base = base
        self.subs = tuple(subs)
        self.sub_outputs = tuple((sub.offset, sub.width) for sub in self.subs)
        self.context = context
        n = len(self.subs)
        device = base.weight.device
        # The model's dtype: the products run where the base matmuls run (bf16 units on CPU).
        dtype = base.weight.dtype
        if device.type == "cpu":
            # On huge pages (kernels/cpu/huge_pages.py): a step with many adapters reads a few
            # hundred KB of each slot's stacks, scattered over the pool; with 4 KiB pages every
            # few KB is a TLB miss and the prefetchers stop at each page (bench/history/
            # RESULTS-2026-11.md, session 19: 34 distinct adapters' runs 9.3 -> 7.9 ms).
            self.lora_a = huge_pages.empty(
                (max_loras, n * max_rank, base.in_features), dtype
            ).zero_()
            # Stored [max_loras, n * max_rank, out_features] and seen transposed: the CPU path's
            # B operands (one slot's columns, a range of slots) are then views, never copies.
            self.lora_b = (
                huge_pages.empty((max_loras, n * max_rank, base.out_features), dtype)
                .zero_()
                .transpose(1, 2)
            )
        else:
            self.lora_a = torch.zeros(
                max_loras, n * max_rank, base.in_features, dtype=dtype, device=device
            )
            self.lora_b = torch.zeros(
                max_loras, base.out_features, n * max_rank, dtype=dtype, device=device
            )
        # slot -> does its adapter target any sub-projection here (host side, so a batch whose
        # adapters all skip this projection launches nothing for it)
        self.targets = [False] * max_loras
        # views of the stacks set_slot writes through, by (slot, ...): see slot_writes
        self._views: dict[tuple[object, ...], tuple[torch.Tensor, torch.Tensor]] = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [num_tokens, in_features]
        # The base may be an nn.Linear or its packed form (engine/step/packed_linear.py).
        out = self.base(x)  # [num_tokens, out_features]
        for part, meta in self._parts_with_deltas(x.shape[0]):
            rows = part.rows
            lora_add(
                x[rows],
                self.lora_a,
                self.lora_b,
                meta,
                out[rows],
                form=part.form,
                sub_outputs=self.sub_outputs,
                cpu_gathered=self.context.cpu_gathered,
            )
        return out

    def silu_forward(self, x: torch.Tensor) -> torch.Tensor | None:
        """The base's fused SiLU pass (engine/step/packed_linear.py) where no token of this step adds
        a delta here (the delta must come before the SiLU); None: the caller runs the two steps."""
        fused = getattr(self.base, "silu_forward", None)
        if fused is None or self._parts_with_deltas(x.shape[0]):
            return None
        result: torch.Tensor | None = fused(x)
        return result

    def _parts_with_deltas(self, num_rows: int) -> list[tuple[LoRAPart, LoRAKernelMeta]]:
        """The step's parts (and this wrapper's kernel metadata for each) in which some token's
        adapter targets a sub-projection here; none without a batch."""
        batch = self.context.batch
        if batch is None:
            return []
        if batch.num_tokens != num_rows:  # the kernels would read and write past the rows
            raise RuntimeError(
                f"the step's adapter batch covers {batch.num_tokens} rows, the input has {num_rows}"
            )
        found = []
        for part in batch.parts:
            meta = part.metas[len(self.subs) - 1]
            if any(self.targets[s] for s in meta.active_slots):
                found.append((part, meta))
        return found

    def slot_writes(
        self, slot: int, layer: int, adapter: LoadedAdapter | None, writes: SlotWrites
    ) -> None:
        """Add to `writes` what sets one slot of this wrapper (every sub-projection) to
        `adapter`'s weights of `layer`, or clears it (None)."""
        # Views made once (self._views): making one is a torch call, which hands the GIL to
        # any thread that wants it (see SlotWrites).
        whole = self._views.get(("slot", slot))
        if whole is None:
            whole = self._views[("slot", slot)] = (self.lora_a[slot], self.lora_b[slot])
        a_slot, b_slot = whole
        writes.zeros += whole
        self.targets[slot] = False
        if adapter is None:
            return
        r = adapter.rank
        for i, sub in enumerate(self.subs):
            weights = adapter.modules.get((layer, sub.module))
            if weights is None:
                continue
            rank = weights.rank
            key = (slot, i, r, rank)
            views = self._views.get(key)
            if views is None:
                views = self._views[key] = (
                    a_slot[i * r : i * r + rank],
                    b_slot[sub.offset : sub.offset + sub.width, i * r : i * r + rank],
                )
            writes.add(views[0], weights.lora_a)  # [rank, in_features]
            writes.add(views[1], weights.lora_b)  # [width, rank]
            self.targets[slot] = True


@dataclass
class SlotWrites:
    """A slot's writes over every wrapper, run as two calls (torch's foreach ops take a list
    each). Why: one torch call per tensor was ~200 calls an activation, and each hands the GIL
    to whatever thread wants it; while the adapter reader thread was reading, the engine loop
    waited for it at each, and an activation took ~14 ms on the loop against ~2 ms alone
    (bench/history/RESULTS-2026-11.md, session 19)."""

    zeros: list[torch.Tensor] = field(default_factory=list)
    targets: list[torch.Tensor] = field(default_factory=list)
    sources: list[torch.Tensor] = field(default_factory=list)
    non_blocking: bool = False  # pinned sources: the copies may run asynchronously on CUDA

    def add(self, target: torch.Tensor, source: torch.Tensor) -> None:
        self.targets.append(target)
        self.sources.append(source)
        self.non_blocking = self.non_blocking or source.is_pinned()

    def run(self) -> None:
        """The zeros first: the copies overwrite parts of them."""
        if self.zeros:
            torch._foreach_zero_(self.zeros)
        if self.targets:
            torch._foreach_copy_(self.targets, self.sources, non_blocking=self.non_blocking)


def _sub_projections(modules: Sequence[str], dims: BaseModelDims) -> list[SubProjection]:
    subs, offset = [], 0
    for module in modules:
        width = dims.in_out(module)[1]
        subs.append(SubProjection(module, offset, width))
        offset += width
    return subs


def slot_num_bytes(
    layout: Mapping[str, tuple[str, ...]],
    dims: BaseModelDims,
    *,
    max_rank: int,
    element_size: int,
) -> int:
    """Bytes one slot takes in every wrapper of the model together (lora_a + lora_b)."""
    per_layer = 0
    for modules in layout.values():
        subs = _sub_projections(modules, dims)
        in_features = dims.in_out(modules[0])[0]
        out_features = subs[-1].offset + subs[-1].width
        per_layer += len(subs) * max_rank * (in_features + out_features)
    return dims.num_layers * per_layer * element_size


class LoRALayers:
    """Every LoRA wrapper of one model, by decoder layer; fills and clears slots."""

    def __init__(
        self,
        decoder_layers: Iterable[nn.Module],
        layout: Mapping[str, tuple[str, ...]],
        dims: BaseModelDims,
        *,
        max_loras: int,
        max_rank: int,
    ):
        """`layout` maps a projection's attribute path inside a decoder layer to the PEFT
        modules fused into it, in output order (e.g. "self_attn.qkv_proj" -> q, k, v)."""
        self.context = LoRAStepContext()
        self.max_loras = max_loras
        self.max_rank = max_rank
        self.max_fused = max(len(modules) for modules in layout.values())
        self.wrappers: list[tuple[int, LoRALinear]] = []
        for layer_index, layer in enumerate(decoder_layers):
            for path, modules in layout.items():
                parent_path, _, attr = path.rpartition(".")
                parent = layer.get_submodule(parent_path) if parent_path else layer
                base = getattr(parent, attr)
                if not isinstance(base, nn.Linear):
                    raise TypeError(f"{path} of layer {layer_index} is not an nn.Linear")
                subs = _sub_projections(modules, dims)
                if subs[-1].offset + subs[-1].width != base.out_features:
                    raise ValueError(f"{path}: fused widths do not add up to out_features")
                wrapper = LoRALinear(
                    base, subs, max_loras=max_loras, max_rank=max_rank, context=self.context
                )
                setattr(parent, attr, wrapper)
                self.wrappers.append((layer_index, wrapper))

    def warm_up_cpu(self) -> str:
        """Make the CPU path's short-run kernel ready now, not on the first request's step: the
        C kernel (kernels/cpu/rows.py, built once per machine), else inductor's compile of
        the same kernel, else that kernel run eager (no C++ compiler at all: correct, but it
        copies each row's weights). Returns which one runs ("native"/"compiled"/"eager")."""
        stacks = [(w.lora_a, w.lora_b.transpose(1, 2), w.sub_outputs) for _, w in self.wrappers]
        kernel: GatheredKernel
        try:
            kernel, which = native_rows(), "native"
        except NoCompilerError as exc:  # inductor compiles C++ too: nothing would compile
            logger.info("LoRA CPU kernel: eager (%s)", exc)
            self.context.cpu_gathered = gathered_rows
            return "eager"
        except NativeBuildError as exc:
            logger.warning("LoRA CPU kernel: C build failed (%s); compiling it with inductor", exc)
            kernel, which = compiled_gathered_rows(), "compiled"
        try:
            # the C kernel hands a dtype it lacks (float16) to inductor's: compiled here too
            warm_up(kernel, stacks)
        except Exception as exc:  # inductor raises many kinds; any of them means "cannot compile"
            logger.warning("LoRA CPU kernel: compile failed (%s); running it eager", exc)
            self.context.cpu_gathered = gathered_rows
            return "eager"
        self.context.cpu_gathered = kernel
        return which

    @property
    def dtype(self) -> torch.dtype:
        """The slot stacks' dtype: the model's."""
        return self.wrappers[0][1].lora_a.dtype

    @property
    def num_bytes(self) -> int:
        """The slot stacks' memory, every wrapper together."""
        return sum(w.lora_a.nbytes + w.lora_b.untyped_storage().nbytes() for _, w in self.wrappers)

    def set_slot(self, slot: int, adapter: LoadedAdapter | None) -> None:
        if adapter is not None and adapter.rank > self.max_rank:
            raise ValueError(f"adapter rank {adapter.rank} exceeds max_lora_rank {self.max_rank}")
        writes = SlotWrites()
        for layer_index, wrapper in self.wrappers:
            wrapper.slot_writes(slot, layer_index, adapter, writes)
        writes.run()
