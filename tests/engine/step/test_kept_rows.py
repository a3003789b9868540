"""The last layer on a step's sampling rows alone (engine/models/llama.py's KeptRows): every
logit the engine samples from equals the one the whole last layer gives, with and without
adapters, and the pruned form really runs (prefill steps, mixed with decodes)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from engine.loop.llm_engine import LLMEngine
from engine.models.llama import KeptRows
from engine.step import model_runner, native_matmul
from kernels.cpu.matmul import native_matmul as kernel_of
from tests.engine.engine_helpers import (
    capture_step_logits,
    pinned_engine,
    random_prompts,
    request,
    run_to_completion,
)
from tests.lora.peft_builders import AdapterSpec, make_peft_adapter

# The matmul kernel sums each row alone, in one order whatever the rows beside it: there the
# kept rows' logits are the same bits. oneDNN may block a matmul of 3 rows and one of 300
# differently, so through PyTorch's matmul they are equal to a rounding.
KERNEL_CASES = [("on", d) for d in (torch.bfloat16, torch.float32) if kernel_of().takes(d)]
CASES = [("off", torch.float32), ("off", torch.bfloat16), *KERNEL_CASES]
ADAPTERS = [
    AdapterSpec("all", r=16, alpha=8, seed=2),
    AdapterSpec("mlp", r=8, alpha=8, targets=r".*\.mlp\.(gate|up)_proj", seed=7),
    AdapterSpec("partial", r=8, alpha=16, targets=["o_proj", "down_proj"], seed=8),
]


@pytest.fixture(autouse=True)
def _always_packed(monkeypatch: pytest.MonkeyPatch) -> None:
    """`native_matmul: on` packs float32 weights only where a start-up timing finds it faster;
    two engines timed on a loaded machine could differ. Pack whatever the timing says."""
    monkeypatch.setattr(native_matmul, "packing_pays", lambda model, dtype: (True, "test"))


def _engine(model_dir: Path, matmul: str, dtype: torch.dtype, **overrides: object) -> LLMEngine:
    # chunks of long prompts beside decodes: steps whose rows are mostly not sampled
    settings = {"max_num_batched_tokens": 48, "decode_attention": "sdpa", **overrides}
    return pinned_engine(model_dir, dtype, native_matmul=matmul, **settings)


def _count_pruned_steps(engine: LLMEngine) -> list[int]:
    """[how many forwards ran their last layer on kept rows, how many of them on none]."""
    count = [0, 0]
    forward = engine.runner.model.forward

    def counting(*args: object, **kwargs: object) -> torch.Tensor:
        keep = args[4] if len(args) > 4 else kwargs.get("keep")
        if isinstance(keep, KeptRows):
            count[0] += 1
            count[1] += len(keep.rows) == 0
            assert len(keep.rows) < len(args[0])  # type: ignore[arg-type]
        return forward(*args, **kwargs)  # type: ignore[arg-type]

    engine.runner.model.forward = counting  # type: ignore[method-assign]
    return count


def _run_both(
    monkeypatch: pytest.MonkeyPatch, make: object, prompts: list[list[int]], adapter_of: object
) -> tuple[dict[bool, object], list[int]]:
    """Each prompt through an engine with pruning and one without: (tokens, logits) per form,
    and _count_pruned_steps' counts of the pruning engine."""
    results: dict[bool, object] = {}
    pruned_steps = [0, 0]
    for prune in (True, False):
        with monkeypatch.context() as patch:
            if not prune:
                patch.setattr(model_runner, "_kept_rows", lambda ordered: None)
            engine = make()  # type: ignore[operator]
            count = _count_pruned_steps(engine)
            logits = capture_step_logits(engine)
            for i, prompt in enumerate(prompts):
                base = request(f"r{i}", prompt, max_tokens=4 + i)
                engine.add_request(dataclasses.replace(base, adapter_name=adapter_of(i)))  # type: ignore[operator]
            results[prune] = (run_to_completion(engine), logits)
            if prune:
                pruned_steps = count
            else:
                assert count[0] == 0
    return results, pruned_steps


def _assert_same(results: dict[bool, object], n: int, exact: bool, dtype: torch.dtype) -> None:
    (pruned, pruned_logits), (whole, whole_logits) = results[True], results[False]  # type: ignore[misc]
    for i in range(n):
        rid = f"r{i}"
        assert pruned.tokens_of(rid) == whole.tokens_of(rid)
        assert len(pruned_logits[rid]) == len(whole_logits[rid]) == 4 + i
        for a, b in zip(pruned_logits[rid], whole_logits[rid], strict=True):
            if exact:
                assert torch.equal(a, b)
            else:
                tol = 2e-2 if dtype == torch.bfloat16 else 1e-5
                torch.testing.assert_close(a, b, rtol=tol, atol=tol)


@pytest.mark.parametrize(("matmul", "dtype"), CASES, ids=lambda c: str(c))
def test_pruned_last_layer_gives_the_whole_layers_logits(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, matmul: str, dtype: torch.dtype
) -> None:
    # the first prompt alone fills two steps of 48 and samples in neither
    prompts = random_prompts(seed=5, lengths=[130, 3, 33, 17, 100, 9], vocab=2600)
    results, (pruned_steps, empty_steps) = _run_both(
        monkeypatch, lambda: _engine(tiny_model_dir, matmul, dtype), prompts, lambda i: None
    )
    assert pruned_steps >= 6 and empty_steps >= 2  # 292 prompt tokens in chunks of <= 48
    _assert_same(results, len(prompts), exact=matmul == "on", dtype=dtype)


def test_pruned_last_layer_with_adapters_gives_the_whole_layers_logits(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows of three adapters and of the base model: the last layer's projections switch to
    the kept rows' adapter batch (and a prompt chunk that samples nothing adds no delta)."""
    paths = {s.name: make_peft_adapter(tiny_model_dir, tmp_path / s.name, s) for s in ADAPTERS}
    names: list[str | None] = [None, *paths]

    def make() -> LLMEngine:
        engine = _engine(
            tiny_model_dir, "off", torch.float32, max_lora_rank=16, max_loras=4, max_cpu_loras=4
        )
        assert engine.lora is not None
        for name, path in paths.items():
            engine.lora.add(name, str(path))
        return engine

    prompts = random_prompts(seed=9, lengths=[60, 4, 41, 18, 90, 7, 25], vocab=2600)
    results, (pruned_steps, empty_steps) = _run_both(
        monkeypatch, make, prompts, lambda i: names[i % len(names)]
    )
    assert pruned_steps >= 5 and empty_steps >= 1
    _assert_same(results, len(prompts), exact=False, dtype=torch.float32)
