"""The parts an LLMEngine is built from that need no engine state: the dtype it runs in, its KV
block count, its sampler and its grammar compiler, each from the config and the model's own
config; and the prompt checks against the model's limits. Apart from engine/loop/llm_engine.py so the engine reads as admit, step and emit."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from engine.config import EngineConfig
from engine.errors import InvalidRequestError
from engine.models.hf_config import ModelConfig
from engine.sampling.sampler import Sampler
from engine.step.model_runner import ModelRunner, kv_bytes_per_block
from engine.structured.compiler import CompilerLimits, GrammarCompiler
from engine.structured.masks import MaskOps
from kernels.cpu.native.build import built_or_none
from kernels.cpu.token_mask import token_mask

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(name: str, checkpoint: str | None, device: torch.device) -> torch.dtype:
    """The option's dtype; "auto" is the checkpoint's, float32 where it names none."""
    if name != "auto":
        return _DTYPES[name]
    if checkpoint in _DTYPES:
        dtype = _DTYPES[checkpoint]
        # CPUs without fast fp16 matmul run fp16 checkpoints in bf16-free float32.
        return torch.float32 if dtype is torch.float16 and device.type == "cpu" else dtype
    return torch.float32


def num_kv_blocks(config: EngineConfig, mc: ModelConfig, dtype: torch.dtype) -> int:
    """The option's block count, or as many blocks as the KV cache's memory holds."""
    per_block = kv_bytes_per_block(mc, config.block_size, dtype)
    return config.num_kv_blocks or max(1, config.kv_cache_memory_bytes // per_block)


def build_sampler(
    config: EngineConfig,
    mc: ModelConfig,
    runner: ModelRunner,
    dtype: torch.dtype,
    device: torch.device,
    num_threads: int,
) -> Sampler:
    # the layer kernels' argmax for greedy rows where they take the logits' dtype (the
    # model's: bf16 or float32; float16 keeps torch's)
    native = runner.native_layer
    argmax = None
    if native is not None and native.supports(torch.empty(0, dtype=dtype)):
        argmax = native.argmax
    return Sampler(
        mc.vocab_size,
        device,
        seed=config.seed,
        argmax=argmax,
        grammar_threads=num_threads,
        mask_ops=MaskOps(
            built_or_none(token_mask, "token mask kernels unavailable; PyTorch instead")
            if device.type == "cpu"
            else None
        ),
    )


def build_grammars(config: EngineConfig, mc: ModelConfig) -> GrammarCompiler:
    """Structured outputs' grammars, compiled against the model's tokenizer (loaded on the
    first request that asks for one)."""
    return GrammarCompiler.for_model(
        config.model,
        mc.vocab_size,
        sorted(mc.eos_token_ids),
        CompilerLimits(
            cache_entries=config.grammar_cache_entries,
            compile_timeout_s=config.grammar_compile_timeout_s,
            compile_nice=config.grammar_compile_nice,
        ),
    )


def check_prompt(tokens: Sequence[int], vocab_size: int, max_model_len: int) -> None:
    """A prompt the model can take: token ids in its vocabulary, room for one token more."""
    if not tokens:
        raise InvalidRequestError("token_ids must not be empty", param="token_ids")
    if min(tokens) < 0:
        raise InvalidRequestError("token ids must not be negative", param="token_ids")
    if max(tokens) >= vocab_size:
        raise InvalidRequestError(
            f"token id {max(tokens)} is outside the vocabulary [0, {vocab_size})",
            param="token_ids",
        )
    if len(tokens) >= max_model_len:
        raise InvalidRequestError(
            f"the prompt has {len(tokens)} tokens; the context length is {max_model_len} "
            "and at least one token must be generated",
            param="token_ids",
        )


def optional_path(path: str | None) -> Path | None:
    return None if path is None else Path(path)
