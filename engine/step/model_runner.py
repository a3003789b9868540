"""Turns a SchedulerOutput into one batched forward pass over the paged KV cache.

Flat batch layout: decode tokens first (one per sequence, batched attention), then each
prefill chunk contiguously (attention per chunk); engine/step/inputs.py builds the step's inputs.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.models.hf_config import ModelConfig
from engine.models.llama import KeptRows, LlamaForCausalLM
from engine.outputs import ScheduledSeq, SchedulerOutput
from engine.scheduling.scheduler import adapter_of
from engine.scheduling.sequence import Sequence
from engine.step.attention import AttentionMetadata, DecodeBackend, prefill_chunks
from engine.step.choices.startup import StartupChoices
from engine.step.compile_decode import CompiledDecode
from engine.step.decode_backend import choose_decode_backend
from engine.step.inputs import StepInputs
from engine.step.native_decoder import NativeDecodeStep, build_native_decode_step
from engine.step.prefill_backend import choose_prefill_kernel, choose_prefill_softmax
from kernels.cpu import huge_pages
from kernels.cpu.decoder import PrefillStep
from kernels.cpu.layer import native_layer
from kernels.cpu.native.build import built_or_none
from lora.batch import LoRABatch
from lora.manager import LoRAManager

log = logging.getLogger(__name__)


@dataclass
class PromptLogits:
    seq: Sequence
    first_position: int  # prompt position of the first row (its target is the next token)
    logits: torch.Tensor  # [num_positions, vocab]
    target_ids: list[int]


@dataclass
class ForwardOutput:
    sampling_seqs: list[Sequence]
    logits: torch.Tensor  # [len(sampling_seqs), vocab] at each sampling sequence's last position
    prompt_logits: list[PromptLogits]


def kv_bytes_per_block(config: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    element = torch.tensor([], dtype=dtype).element_size()
    return 2 * config.num_layers * block_size * config.kv_size * element


class ModelRunner:
    def __init__(
        self,
        model: LlamaForCausalLM,
        config: ModelConfig,
        *,
        num_blocks: int,
        block_size: int,
        dtype: torch.dtype,
        device: torch.device,
        lora: LoRAManager | None = None,
        decode_attention: str = "auto",
        prefill_attention: str = "auto",
        compile_decode: bool = False,
        fused_layer_ops: bool = False,
        max_num_seqs: int = 64,
        compile_cache_dir: Path | None = None,
        native_decode_step: bool = True,
        choices: StartupChoices | None = None,
    ):
        self.model = model
        self.lora = lora
        self.decode_backend: DecodeBackend = choose_decode_backend(
            decode_attention,
            num_heads=config.num_heads,
            num_kv_heads=config.num_kv_heads,
            head_dim=config.head_dim,
            dtype=dtype,
            device=device,
            choices=choices,
        )
        native = None
        if fused_layer_ops and device.type == "cpu":
            native = built_or_none(
                native_layer, "fused layer kernels unavailable; PyTorch operators instead"
            )
        if native is not None:
            model.use_layer_ops(native)
        self.native_layer = native  # also the sampler's greedy argmax (engine/loop/llm_engine.py)
        self.prefill_softmax = choose_prefill_softmax(
            prefill_attention,
            native,
            num_heads=config.num_heads,
            num_kv_heads=config.num_kv_heads,
            head_dim=config.head_dim,
            dtype=dtype,
            device=device,
            choices=choices,
        )
        self.prefill_kernel = choose_prefill_kernel(
            self.prefill_softmax, head_dim=config.head_dim, dtype=dtype, device=device
        )
        self.config = config
        self.block_size = block_size
        self.device = device
        self.inputs = StepInputs(block_size, device)
        # The compiled path's padded rows write into one more block, never handed out.
        num_slots = (num_blocks + (1 if compile_decode else 0)) * block_size
        shape = (config.num_kv_heads, num_slots, config.head_dim)
        self.kv_caches = [
            (_zeros(shape, dtype, device), _zeros(shape, dtype, device))
            for _ in range(config.num_layers)
        ]  # per layer: ([kv_heads, num_slots, head_dim], same): head-major, see attention.py
        self.compiled: CompiledDecode | None = None
        if compile_decode:
            self.compiled = CompiledDecode(
                model,
                self.kv_caches,
                block_size=block_size,
                scratch_block=num_blocks,
                max_num_seqs=max_num_seqs,
                cache_dir=compile_cache_dir,
                native_attention=self.decode_backend == "native",
            )
            self.compiled.warm_up()
        self.native_step: NativeDecodeStep | None = None
        if native_decode_step and self.compiled is None and device.type == "cpu":
            self.native_step, why = build_native_decode_step(
                model,
                self.kv_caches,
                block_size=block_size,
                native_layer=native,
                decode_backend=self.decode_backend,
                lora=None if lora is None else lora.layers.context,
                prefill_kernel=self.prefill_kernel,
            )
            log.info("native decode step: %s", why)

    @torch.inference_mode()
    def execute(self, sched: SchedulerOutput) -> ForwardOutput:
        decodes = [s for s in sched.scheduled if s.num_new_tokens == 1 and not s.seq.is_prefilling]
        prefills = [s for s in sched.scheduled if s.num_new_tokens > 1 or s.seq.is_prefilling]
        has_lora = self.lora is not None and any(
            s.seq.adapter_id is not None for s in decodes + prefills
        )
        if has_lora:
            # Tokens of one adapter side by side: one run per adapter for the segmented form,
            # locality for the gathered one. Order within the batch changes no result.
            decodes.sort(key=self._adapter_slot)
            prefills.sort(key=self._adapter_slot)
        ordered = decodes + prefills
        input_ids, positions, slots = self.inputs.flatten(ordered)
        hidden = None
        if decodes and not prefills:
            hidden = self._decode_only(decodes, has_lora, input_ids, positions, slots)
        if hidden is not None:
            return self._logits(ordered, hidden)
        kept = _kept_rows(ordered)
        hidden = self._prefill_native(
            decodes, prefills, has_lora, input_ids, positions, slots, kept
        )
        if hidden is None:
            hidden = self._forward_eager(
                decodes, prefills, has_lora, input_ids, positions, slots, kept
            )
        if kept is not None:  # hidden holds the sampling rows alone, in order
            return ForwardOutput(_sampling_seqs(ordered), self.model.compute_logits(hidden), [])
        return self._logits(ordered, hidden)

    def _decode_only(
        self,
        decodes: list[ScheduledSeq],
        has_lora: bool,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        slots: torch.Tensor,
    ) -> torch.Tensor | None:  # [num_decodes, hidden], or None: the eager path takes the step
        """A decode-only step by the compiled forward (the base model) or the native call
        (engine/step/native_decoder.py), where one of them takes it."""
        compiled = self.compiled is not None and not has_lora
        step = self.native_step
        native = step is not None and (not has_lora or step.takes_lora) and step.takes(len(decodes))
        if not (compiled or native):
            return None
        tables = self.inputs.decode_tables(decodes)
        lengths = self.inputs.decode_lengths(decodes)
        if self.compiled is not None and compiled:
            return self.compiled.forward(input_ids, positions, slots, tables, lengths)
        assert step is not None
        lora = self._lora_batch(decodes, len(decodes)) if has_lora else None
        return step.forward(input_ids, positions, slots, tables, lengths, lora)

    def _forward_eager(
        self,
        decodes: list[ScheduledSeq],
        prefills: list[ScheduledSeq],
        has_lora: bool,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        slots: torch.Tensor,
        kept: list[int] | None,
    ) -> torch.Tensor:  # [num_tokens, hidden]; [len(kept), hidden] where `kept` is given
        ordered = decodes + prefills
        meta = AttentionMetadata(
            slot_mapping=slots,
            num_decodes=len(decodes),
            block_size=self.block_size,
            decode_tables=self.inputs.decode_tables(decodes) if decodes else None,
            decode_lengths=[item.seq.num_computed_tokens + 1 for item in decodes],
            prefills=self.inputs.prefill_segments(len(decodes), prefills),
            decode_backend=self.decode_backend,
            prefill_softmax=self.prefill_softmax,
            prefill_kernel=self.prefill_kernel,
        )
        keep = None if kept is None else KeptRows(self.inputs.rows(kept))
        if has_lora:
            return self._forward_lora(ordered, len(decodes), input_ids, positions, meta, keep)
        return self.model(input_ids, positions, self.kv_caches, meta, keep)

    def _prefill_native(
        self,
        decodes: list[ScheduledSeq],
        prefills: list[ScheduledSeq],
        has_lora: bool,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        slots: torch.Tensor,
        kept: list[int] | None,
    ) -> torch.Tensor | None:  # as _forward_eager; None: the eager path takes the step
        """A step with prefill chunks by the native call (engine/step/native_decoder.py), where it
        takes it: no adapter rows, and the eager step's prefill attention is the native kernel
        the call runs."""
        step = self.native_step
        if (
            step is None
            or not prefills
            or has_lora
            or self.prefill_kernel is None
            or not step.takes_prefill
            or not step.takes(input_ids.shape[0])
        ):
            return None
        segments = self.inputs.prefill_segments(len(decodes), prefills)
        tables = (
            self.inputs.decode_tables(decodes)
            if decodes
            else torch.zeros(0, 1, dtype=torch.long, device=self.device)
        )
        lengths = self.inputs.decode_lengths(decodes)
        prefill = PrefillStep(
            len(decodes),
            prefill_chunks(segments, slots),
            None if kept is None else self.inputs.rows(kept),
        )
        return step.forward_prefill(input_ids, positions, slots, tables, lengths, prefill)

    def _logits(self, ordered: list[ScheduledSeq], hidden: torch.Tensor) -> ForwardOutput:
        sample_rows: list[int] = []
        sampling_seqs: list[Sequence] = []
        prompt_logits: list[PromptLogits] = []
        start = 0
        for item in ordered:
            end = start + item.num_new_tokens
            if item.is_sampling:
                sample_rows.append(end - 1)
                sampling_seqs.append(item.seq)
            if item.seq.request.sampling_params.prompt_logprobs is not None and item.seq.index == 0:
                found = self._prompt_rows(item, start, hidden)
                if found is not None:
                    prompt_logits.append(found)
            start = end
        logits = self.model.compute_logits(hidden[self.inputs.rows(sample_rows)])
        return ForwardOutput(sampling_seqs, logits, prompt_logits)

    def _adapter_slot(self, item: ScheduledSeq) -> int:
        adapter = adapter_of(item.seq)
        slot = None if adapter is None or self.lora is None else self.lora.cache.slot_of(adapter)
        return -1 if slot is None else slot

    def _forward_lora(
        self,
        ordered: list[ScheduledSeq],
        num_decodes: int,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        keep: KeptRows | None,
    ) -> torch.Tensor:  # [num_tokens, hidden]; with `keep`, [num_kept, hidden]
        assert self.lora is not None
        context = self.lora.layers.context
        context.batch = self._lora_batch(ordered, num_decodes)
        if keep is not None:
            # the kept rows are the sampling rows, one token each, in `ordered`'s order
            sampling = _sampling_seqs(ordered)
            kept_batch = self.lora.batch_for(
                [adapter_of(seq) for seq in sampling],
                [1] * len(sampling),
                num_decodes=len(sampling),
            )

            def use_kept_batch() -> None:
                context.batch = kept_batch

            keep = KeptRows(keep.rows, on_prune=use_kept_batch)
        try:
            return self.model(input_ids, positions, self.kv_caches, meta, keep)
        finally:
            context.batch = None

    def _lora_batch(self, ordered: list[ScheduledSeq], num_decodes: int) -> LoRABatch | None:
        """The step's adapter metadata (rows in `ordered`'s flat order)."""
        assert self.lora is not None
        return self.lora.batch_for(
            [adapter_of(item.seq) for item in ordered],
            [item.num_new_tokens for item in ordered],
            num_decodes=num_decodes,
        )

    def _prompt_rows(
        self, item: ScheduledSeq, start: int, hidden: torch.Tensor
    ) -> PromptLogits | None:
        seq = item.seq
        first = seq.num_computed_tokens
        # Positions whose next token is still a prompt token (the last prompt position predicts
        # the first output token, which is not a prompt logprob).
        last = min(first + item.num_new_tokens, seq.num_prompt_tokens - 1)
        if last <= first:
            return None
        logits = self.model.compute_logits(hidden[start : start + last - first])
        return PromptLogits(seq, first, logits, seq.token_ids[first + 1 : last + 1])


def _kept_rows(ordered: list[ScheduledSeq]) -> list[int] | None:
    """The step's sampling rows, where the last layer may run on them alone (KeptRows; none
    where the step's chunks all end inside their prompts: that layer then only writes its K/V);
    None where every row is read: all are sampled (decode-only), or some sequence asks for
    prompt logprobs (they read every prompt row)."""
    rows: list[int] = []
    end = 0
    for item in ordered:
        if item.seq.request.sampling_params.prompt_logprobs is not None:
            return None
        end += item.num_new_tokens
        if item.is_sampling:
            rows.append(end - 1)
    return rows if len(rows) < end else None


def _sampling_seqs(ordered: list[ScheduledSeq]) -> list[Sequence]:
    return [item.seq for item in ordered if item.is_sampling]


def _zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A KV cache tensor; on the CPU on huge pages (kernels/cpu/huge_pages.py: decode attention
    reads its blocks scattered over the whole cache, a TLB miss a block on 4 KiB pages)."""
    if device.type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    return huge_pages.empty(shape, dtype).zero_()
