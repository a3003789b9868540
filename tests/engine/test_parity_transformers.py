"""Acceptance 1: greedy token ids identical to transformers `generate`, logits within 1e-4
for the reference layers, 2e-4 for the fast ones (`fast`; tests/engine/engine_helpers.py says
why).

32 prompts of lengths 1..300 with mixed max_tokens are all in flight together; the same with
a 64-token step budget (forced chunked prefill), for Llama (llama3 RoPE), Qwen2 (qkv bias),
Qwen3 (q/k norm) and tied embeddings.
"""

from __future__ import annotations

import pytest
import torch

from engine.config import EngineConfig
from engine.loop.llm_engine import LLMEngine
from tests.engine.engine_helpers import (
    FAST_TOLERANCE,
    REFERENCE_TOLERANCE,
    check_greedy_parity,
    random_prompts,
    transformers_greedy,
)

NUM_PROMPTS = 32
LENGTHS = [1, 2, 3, 7, 15, 16, 17, 31, 33, 47, 64, 65, 80, 99, 100, 127, 128, 129, 150, 160,
           175, 190, 200, 215, 230, 240, 255, 256, 257, 270, 290, 300]  # fmt: skip
MAX_TOKENS = [1 + (i * 7) % 24 for i in range(NUM_PROMPTS)]

_references: dict[tuple[str, bool], tuple[list[list[int]], list[torch.Tensor]]] = {}


def transformers_reference(model_dir, key, prompts):  # type: ignore[no-untyped-def]
    """Per-prompt greedy generate and first-step logits (cached per model within the run)."""
    if key not in _references:
        _references[key] = transformers_greedy(model_dir, prompts, MAX_TOKENS)
    return _references[key]


@pytest.mark.parametrize(
    "family, tie, budget, enforce_eager, decode_attention, fast, prefill_attention",
    [
        # eager steps, decode attention by the C++ kernel that reads the paged cache in place,
        # each layer's norms, RoPE and SiLU by the fused C++ kernels, weights packed where that
        # pays (the defaults)
        ("llama", False, 2048, True, "native", True, "auto"),
        ("llama", False, 64, True, "native", True, "auto"),
        # ... prefill chunks by two matmuls around the native causal softmax, pinned (fresh
        # prompts at budget 2048, chunks after context at 64; "auto" rows take the timing's)
        ("llama", False, 2048, True, "native", True, "matmul"),
        ("qwen2", False, 64, True, "native", True, "matmul"),
        ("qwen2", False, 64, True, "native", True, "auto"),
        ("qwen3", False, 64, True, "native", True, "auto"),
        ("llama", True, 64, True, "native", True, "auto"),
        # ... decode attention by the gathering backends, the reference layers
        ("llama", False, 64, True, "matmul", False, "auto"),
        ("qwen3", False, 64, True, "sdpa", False, "auto"),
        # The compiled decode path (engine/step/compile_decode.py): decode-only steps compiled,
        # steps with a prefill chunk eager, one KV cache shared by both.
        # (native: the C++ kernel an opaque operator in the graph; matmul: paged_decode.py)
        ("llama", False, 2048, False, "native", True, "auto"),
        ("qwen2", False, 64, False, "matmul", True, "auto"),
        ("qwen3", False, 64, False, "native", False, "auto"),
    ],
)
def test_greedy_parity_with_transformers(
    model_factory,
    tmp_path_factory,
    family,
    tie,
    budget,
    enforce_eager,
    decode_attention,
    fast,
    prefill_attention,
):
    assert len(LENGTHS) == NUM_PROMPTS
    model_dir = model_factory(family=family, tie=tie)
    engine = LLMEngine(
        EngineConfig(
            model=str(model_dir),
            dtype="float32",
            num_kv_blocks=1024,
            max_num_seqs=NUM_PROMPTS,
            max_num_batched_tokens=budget,
            enforce_eager=enforce_eager,
            decode_attention=decode_attention,
            prefill_attention=prefill_attention,
            fused_layer_ops=fast,
            prepack_weights=fast,
            compile_cache_dir=str(tmp_path_factory.getbasetemp() / "inductor"),
        )
    )
    assert (engine.runner.model.layer_ops.native is not None) == fast
    if prefill_attention == "matmul":
        assert engine.runner.prefill_softmax is not None
    tolerance = FAST_TOLERANCE if fast else REFERENCE_TOLERANCE
    prompts = random_prompts(seed=1234, lengths=LENGTHS, vocab=engine.vocab_size)
    check_greedy_parity(
        engine,
        prompts,
        MAX_TOKENS,
        lambda: transformers_reference(model_dir, (family, tie), prompts),
        tolerance,
    )
    assert (engine.runner.compiled is None) == enforce_eager
