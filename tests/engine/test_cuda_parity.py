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
from transformers import AutoModelForCausalLM

from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from tests.engine.engine_helpers import (
    REFERENCE_TOLERANCE,
    capture_first_logits,
    count_compiled_steps,
    random_prompts,
    request,
    run_to_completion,
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


def transformers_on_cuda(model_dir, prompts):  # type: ignore[no-untyped-def]
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).cuda().eval()
    hf.generation_config.eos_token_id = None  # the engine runs with ignore_eos
    hf.generation_config.pad_token_id = 0
    tokens, logits = [], []
    with torch.no_grad():
        for prompt, max_tokens in zip(prompts, MAX_TOKENS, strict=True):
            ids = torch.tensor([prompt], device="cuda")
            logits.append(hf(ids).logits[0, -1].float().cpu())
            out = hf.generate(
                ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_tokens
            )
            tokens.append(out[0, len(prompt) :].tolist())
    return tokens, logits


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
    num_compiled = count_compiled_steps(engine)
    prompts = random_prompts(seed=99, lengths=LENGTHS, vocab=engine.vocab_size)
    first_logits = capture_first_logits(engine)
    for i, prompt in enumerate(prompts):
        engine.add_request(request(f"p{i}", prompt, max_tokens=MAX_TOKENS[i]))
    collected = run_to_completion(engine)

    ref_tokens, ref_logits = transformers_on_cuda(model_dir, prompts)
    for i in range(len(LENGTHS)):
        assert collected.tokens_of(f"p{i}") == ref_tokens[i], f"prompt {i} (length {LENGTHS[i]})"
        diff = (first_logits[f"p{i}"].cpu() - ref_logits[i]).abs().max().item()
        assert diff < REFERENCE_TOLERANCE, f"prompt {i}: first-step logits differ by {diff}"
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    assert (num_compiled() > 0) == (not enforce_eager)
