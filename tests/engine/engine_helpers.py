"""Drive a real LLMEngine synchronously in tests and collect what it produced."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from engine.config import EngineConfig
from engine.loop.llm_engine import LLMEngine
from engine.outputs import FinishReason, RequestOutput
from engine.request import EngineRequest, RequestId
from engine.sampling_params import SamplingParams


@dataclass
class Collected:
    tokens: dict[str, dict[int, list[int]]] = field(default_factory=dict)
    finish: dict[str, dict[int, FinishReason]] = field(default_factory=dict)
    outputs: dict[str, list[RequestOutput]] = field(default_factory=dict)
    first_token_step: dict[str, int] = field(default_factory=dict)
    finish_step: dict[str, int] = field(default_factory=dict)

    def add(self, out: RequestOutput, step: int) -> None:
        rid = out.request_id
        self.outputs.setdefault(rid, []).append(out)
        for choice in out.choices:
            self.tokens.setdefault(rid, {}).setdefault(choice.index, []).extend(choice.token_ids)
            if choice.token_ids:
                self.first_token_step.setdefault(rid, step)
            if choice.finish_reason is not None:
                self.finish.setdefault(rid, {})[choice.index] = choice.finish_reason
        if out.finished:
            self.finish_step[rid] = step

    def tokens_of(self, rid: str, index: int = 0) -> list[int]:
        return self.tokens.get(rid, {}).get(index, [])


def request(
    rid: str,
    prompt: Iterable[int],
    *,
    max_tokens: int = 8,
    priority: int = 0,
    salt: str | None = None,
    tenant: str | None = None,
    **params: object,
) -> EngineRequest:
    """A greedy, ignore_eos request unless params say otherwise."""
    sampling = {"temperature": 0.0, "ignore_eos": True, "max_tokens": max_tokens, **params}
    return EngineRequest(
        request_id=RequestId(rid),
        prompt_token_ids=tuple(prompt),
        sampling_params=SamplingParams(**sampling),  # type: ignore[arg-type]
        priority=priority,
        cache_salt=salt,
        fairness_key=tenant,
    )


def pinned_engine(model_dir: Path, dtype: torch.dtype, **settings: object) -> LLMEngine:
    """A small engine (8 sequences, 128 blocks of 16 slots, 512-token steps) whose prefill form
    is pinned, not timed at start-up: two engines timed on a loaded machine may pick two forms,
    whose first tokens then differ before the steps a test compares. `settings` add to these or
    override them."""
    config: dict[str, object] = {
        "model": str(model_dir),
        "dtype": {torch.bfloat16: "bfloat16", torch.float32: "float32"}[dtype],
        "block_size": 16,
        "num_kv_blocks": 128,
        "max_num_seqs": 8,
        "max_num_batched_tokens": 512,
        "prefill_attention": "sdpa",
        **settings,
    }
    return LLMEngine(EngineConfig(**config))  # type: ignore[arg-type]


def run_to_completion(
    engine: LLMEngine, collected: Collected | None = None, max_steps: int = 100_000
) -> Collected:
    collected = collected or Collected()
    for _ in range(max_steps):
        if not engine.has_unfinished_requests():
            engine.check_invariants()
            return collected
        step = engine.scheduler.num_steps
        for out in engine.step():
            collected.add(out, step)
        engine.check_invariants()
    raise AssertionError("engine did not finish")


def _spy_on_logits(engine: LLMEngine, record: Callable[[str, torch.Tensor], None]) -> None:
    """Wrap the real runner: `record(request_id, logits row as float32)` at every sampled row."""
    execute = engine.runner.execute

    def spy(sched):  # type: ignore[no-untyped-def]
        forward = execute(sched)
        for seq, row in zip(forward.sampling_seqs, forward.logits, strict=True):
            record(seq.request.request_id, row.float().clone())
        return forward

    engine.runner.execute = spy  # type: ignore[method-assign]


def capture_first_logits(engine: LLMEngine) -> dict[str, torch.Tensor]:
    """Record each request's logits at its first sampled position (wraps the real runner)."""
    captured: dict[str, torch.Tensor] = {}
    _spy_on_logits(engine, captured.setdefault)
    return captured


def capture_step_logits(engine: LLMEngine) -> dict[str, list[torch.Tensor]]:
    """Record every sampling step's logits (float32) per request (wraps the real runner)."""
    captured: dict[str, list[torch.Tensor]] = {}
    _spy_on_logits(engine, lambda rid, row: captured.setdefault(rid, []).append(row))
    return captured


def transformers_greedy(
    model_dir: Path, prompts: list[list[int]], max_tokens: list[int], device: str = "cpu"
) -> tuple[list[list[int]], list[torch.Tensor]]:
    """The oracle: per prompt, transformers `generate`'s greedy tokens (EOS not special: the
    engine runs with ignore_eos) and the first step's logits (float32, on the CPU)."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device).eval()
    # generate must neither stop at EOS nor suppress it (which min_new_tokens would do)
    hf.generation_config.eos_token_id = None
    hf.generation_config.pad_token_id = 0
    tokens, logits = [], []
    with torch.no_grad():
        for prompt, n in zip(prompts, max_tokens, strict=True):
            ids = torch.tensor([prompt], device=device)
            logits.append(hf(ids).logits[0, -1].float().cpu())
            out = hf.generate(
                ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n
            )
            tokens.append(out[0, len(prompt) :].tolist())
    return tokens, logits


def check_greedy_parity(
    engine: LLMEngine,
    prompts: list[list[int]],
    max_tokens: list[int],
    reference: Callable[[], tuple[list[list[int]], list[torch.Tensor]]],
    tolerance: float,
) -> None:
    """Every prompt in flight together, greedy: each request's tokens equal the reference's
    (`reference()`: transformers_greedy's tokens and first-step logits) and its first-step
    logits lie within `tolerance`; every KV block comes back; the compiled decode path ran
    exactly where the engine has one."""
    num_compiled = count_compiled_steps(engine)
    first_logits = capture_first_logits(engine)
    for i, prompt in enumerate(prompts):
        engine.add_request(request(f"p{i}", prompt, max_tokens=max_tokens[i]))
    collected = run_to_completion(engine)
    ref_tokens, ref_logits = reference()
    for i, prompt in enumerate(prompts):
        assert collected.tokens_of(f"p{i}") == ref_tokens[i], f"prompt {i} (length {len(prompt)})"
        diff = (first_logits[f"p{i}"].cpu() - ref_logits[i]).abs().max().item()
        assert diff < tolerance, f"prompt {i}: first-step logits differ by {diff}"
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    assert (num_compiled() > 0) == (engine.runner.compiled is not None)


def random_prompts(seed: int, lengths: Iterable[int], vocab: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in lengths]


def count_compiled_steps(engine: LLMEngine) -> Callable[[], int]:
    """Count the forward passes the compiled decode path runs (wraps it; 0 when eager)."""
    compiled = engine.runner.compiled
    count = 0
    if compiled is None:
        return lambda: count
    forward = compiled.forward

    def counting(*args: torch.Tensor) -> torch.Tensor:
        nonlocal count
        count += 1
        return forward(*args)

    compiled.forward = counting  # type: ignore[method-assign]
    return lambda: count


# First-step logits against transformers/PEFT in float32: the reference layers (PyTorch
# operators, plain F.linear weights) stay within 1e-4. The fast CPU layers, the defaults (fused
# norm/RoPE/SiLU kernels; oneDNN-packed float32 weights where the start-up timing packs them),
# sum in another order: packing alone measured 9.3e-5 against transformers and 1.6e-4 against
# PEFT on the AVX2 box (bench/history/RESULTS-2026-11.md session 9). Tokens must still be identical.
REFERENCE_TOLERANCE = 1e-4
FAST_TOLERANCE = 2e-4
