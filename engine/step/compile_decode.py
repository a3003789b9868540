"""The decode-only forward pass under torch.compile (inductor; C++ code on the CPU).

A step whose rows are all decodes of the base model (no prefill chunk, no adapter) runs here;
every other step runs eager in the model runner, which stays the reference. The batch is padded
up to a compile size (2, 4, 8, ..., max_num_seqs, like vLLM's compile sizes) so the shapes the
graph sees form a small fixed set that start-up warms; padded rows write their K/V into a
reserved scratch block, attend only to it, and are dropped. Batch and context (the block table's
width) are dynamic dimensions of one graph, so start-up compiles once, not once per size.

Batch 1 is padded to 2: a dimension of size 1 would be specialised into a second graph, and a
decode row costs little next to reading the weights, which both rows share.

Inductor writes its artefacts under `cache_dir` (TORCHINDUCTOR_CACHE_DIR, the only way it is
told): a restart with the same model, dtype and torch finds them there instead of compiling.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from engine.models.llama import LlamaForCausalLM
from engine.step.paged_decode import DecodeMetadata

KVCaches = list[tuple[torch.Tensor, torch.Tensor]]
MIN_COMPILE_SIZE = 2


def compile_sizes(max_num_seqs: int) -> tuple[int, ...]:
    """2, 4, 8, ... below max_num_seqs, then max_num_seqs itself."""
    sizes = []
    size = MIN_COMPILE_SIZE
    while size < max_num_seqs:
        sizes.append(size)
        size *= 2
    sizes.append(max(max_num_seqs, MIN_COMPILE_SIZE))
    return tuple(sizes)


def use_compile_cache(cache_dir: Path | None) -> None:
    """Point inductor at `cache_dir` (None: leave its default), before anything compiles."""
    if cache_dir is not None:
        cache_dir.mkdir(parents=True, exist_ok=True)
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir)


class CompiledDecode:
    def __init__(
        self,
        model: LlamaForCausalLM,
        kv_caches: KVCaches,
        *,
        block_size: int,
        scratch_block: int,
        max_num_seqs: int,
        cache_dir: Path | None,
        native_attention: bool = False,
    ):
        use_compile_cache(cache_dir)
        self.native_attention = native_attention
        self.model = model
        self.kv_caches = kv_caches
        self.block_size = block_size
        self.scratch_block = scratch_block
        self.sizes = compile_sizes(max_num_seqs)
        self._forward = torch.compile(self._decode_forward, fullgraph=True, dynamic=False)

    def _decode_forward(
        self,
        input_ids: torch.Tensor,  # [rows]
        positions: torch.Tensor,  # [rows]
        slot_mapping: torch.Tensor,  # [rows]
        block_tables: torch.Tensor,  # [rows, max_blocks]
        context_lens: torch.Tensor,  # [rows]
    ) -> torch.Tensor:  # [rows, hidden]
        meta = DecodeMetadata(
            slot_mapping, block_tables, context_lens, self.block_size, self.native_attention
        )
        return self.model(input_ids, positions, self.kv_caches, meta)

    def padded_size(self, num_rows: int) -> int:
        for size in self.sizes:
            if size >= num_rows:
                return size
        raise ValueError(f"{num_rows} decode rows exceed the largest compile size {self.sizes}")

    @torch.inference_mode()
    def warm_up(self) -> None:
        """Compile (or load from the cache) and run every compile size once, at start-up."""
        # On the model's device: a graph traced with CPU indices and CUDA weights fails to trace.
        device = self.kv_caches[0][0].device
        scratch_slot = self.scratch_block * self.block_size
        for size in self.sizes:
            num_blocks = 2
            self.forward(
                torch.zeros(size, dtype=torch.long, device=device),
                torch.zeros(size, dtype=torch.long, device=device),
                torch.full((size,), scratch_slot, dtype=torch.long, device=device),
                torch.full((size, num_blocks), self.scratch_block, dtype=torch.long, device=device),
                torch.ones(size, dtype=torch.long, device=device),
            )

    def forward(
        self,
        input_ids: torch.Tensor,  # [rows]
        positions: torch.Tensor,  # [rows]
        slot_mapping: torch.Tensor,  # [rows]
        block_tables: torch.Tensor,  # [rows, max_blocks]
        context_lens: torch.Tensor,  # [rows]
    ) -> torch.Tensor:  # [rows, hidden]
        rows, width = block_tables.shape
        size = self.padded_size(rows)
        padding = size - rows
        # A width of 1 would be specialised into its own graph; a scratch column is masked out.
        extra_blocks = max(0, MIN_COMPILE_SIZE - width)
        if padding or extra_blocks:
            scratch_slot = self.scratch_block * self.block_size
            input_ids = _pad(input_ids, padding, 0)
            positions = _pad(positions, padding, 0)
            slot_mapping = _pad(slot_mapping, padding, scratch_slot)
            context_lens = _pad(context_lens, padding, 1)
            block_tables = torch.nn.functional.pad(
                block_tables, (0, extra_blocks, 0, padding), value=self.scratch_block
            )  # [size, max(width, 2)]
        torch._dynamo.mark_dynamic(block_tables, 0)
        torch._dynamo.mark_dynamic(block_tables, 1)
        for tensor in (input_ids, positions, slot_mapping, context_lens):
            torch._dynamo.mark_dynamic(tensor, 0)
        hidden = self._forward(input_ids, positions, slot_mapping, block_tables, context_lens)
        return hidden[:rows]  # [rows, hidden]


def _pad(values: torch.Tensor, count: int, fill: int) -> torch.Tensor:
    if not count:
        return values
    return torch.cat((values, values.new_full((count,), fill)))  # [len(values) + count]
