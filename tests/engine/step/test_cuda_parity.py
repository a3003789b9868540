"""The engine on a CUDA device: greedy token ids identical to transformers `generate` on the
same device and weights, first-step logits within 1e-4, eager and compiled (the decode-only
steps under torch.compile, which on CUDA means inductor's Triton kernels).

float32 with TF32 off on both sides: TF32 matmuls keep 10 mantissa bits, enough to flip a
greedy choice between two close logits, so neither side may use them. CI has no GPU; these run
on a lent machine (`make test-gpu`) and skip with the reason elsewhere.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from engine.config import EngineConfig
from engine.loop.llm_engine import LLMEngine
from tests.engine.engine_helpers import (
    REFERENCE_TOLERANCE,
    check_greedy_parity,
    random_prompts,
    transformers_greedy,
)

pytestmark = pytest.mark.gpu

LENGTHS = [1, 2, 7, 16, 17, 33, 64, 65, 127, 128, 129, 200, 255, 256, 257, 300]
MAX_TOKENS = [1 + (i * 7) % 24 for i in range(len(LENGTHS))]


@pytest.fixture(autouse=True)
def no_tf32() -> Iterator[None]:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device on this machine")
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn


@pytest.mark.parametrize(
    "family, budget, enforce_eager",
    [
        ("llama", 2048, True),
        ("qwen3", 64, True),  # q/k norm; chunked prefill
        ("llama", 64, False),  # decode-only steps compiled
    ],
)
def test_greedy_parity_on_cuda(model_factory, tmp_path_factory, family, budget, enforce_eager):
    model_dir = model_factory(family=family)
    engine = LLMEngine(
        EngineConfig(
            model=str(model_dir),
            device="cuda",
            dtype="float32",
            num_kv_blocks=512,
            max_num_seqs=len(LENGTHS),
            max_num_batched_tokens=budget,
            enforce_eager=enforce_eager,
            compile_cache_dir=str(tmp_path_factory.getbasetemp() / "inductor-cuda"),
        )
    )
    assert engine.runner.device.type == "cuda"
    prompts = random_prompts(seed=99, lengths=LENGTHS, vocab=engine.vocab_size)
    check_greedy_parity(
        engine,
        prompts,
        MAX_TOKENS,
        lambda: transformers_greedy(model_dir, prompts, MAX_TOKENS, "cuda"),
        REFERENCE_TOLERANCE,
    )
    assert (engine.runner.compiled is None) == enforce_eager
