"""A decode step's layers in one native call (engine/step/native_decoder.py, kernels/cpu/native/decoder.cpp)
against the eager layer-by-layer path over the same kernels: the same values bit for bit, every
step; it runs only where the eager step would have run exactly those kernels."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from engine.loop.llm_engine import LLMEngine
from engine.step import native_matmul
from engine.step.native_decoder import NativeDecodeStep
from kernels.cpu.matmul import native_matmul as kernel_of
from kernels.cpu.rows import native_rows
from tests.conftest import ModelFactory
from tests.engine.engine_helpers import (
    Collected,
    capture_step_logits,
    pinned_engine,
    random_prompts,
    request,
    run_to_completion,
)
from tests.lora.peft_builders import AdapterSpec, make_peft_adapter

pytestmark = pytest.mark.skipif(
    not kernel_of().available,
    reason="this CPU has neither AVX512-BF16 nor AVX2 + FMA: no matmul kernel, no native step",
)
# the dtypes the matmul kernel multiplies in on this CPU
DTYPES = [d for d in (torch.bfloat16, torch.float32) if kernel_of().takes(d)]


@pytest.fixture(autouse=True)
def _always_packed(monkeypatch: pytest.MonkeyPatch) -> None:
    """float32 weights are packed only where a start-up timing finds it faster (on a loaded
    machine it may not), and the matmul kernel takes only packed linears: these tests are about
    the native step's values, so they pack whatever the timing says."""
    monkeypatch.setattr(native_matmul, "packing_pays", lambda model, dtype: (True, "test"))


def _engine(
    model_dir: Path, dtype: torch.dtype, native_step: bool, **overrides: object
) -> LLMEngine:
    settings = {"native_matmul": "on", "decode_attention": "native", **overrides}
    return pinned_engine(model_dir, dtype, native_decode_step=native_step, **settings)


def _count_native_steps(engine: LLMEngine) -> list[int]:
    """[how many steps the native call ran] (0 forever where the engine has none)."""
    count = [0]
    step = engine.runner.native_step
    if step is None:
        return count
    forward = step.forward

    def counting(*args: torch.Tensor) -> torch.Tensor:
        count[0] += 1
        return forward(*args)

    step.forward = counting  # type: ignore[method-assign]
    return count


def _run(engine: LLMEngine, prompts: list[list[int]], max_tokens: int = 12):  # type: ignore[no-untyped-def]
    logits = capture_step_logits(engine)
    for i, prompt in enumerate(prompts):
        engine.add_request(request(f"r{i}", prompt, max_tokens=max_tokens + i))
    return run_to_completion(engine), logits


@pytest.mark.parametrize("family", ["llama", "qwen2"])  # qwen2: biases on q, k and v
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_native_steps_equal_the_eager_steps_bit_for_bit(
    model_factory: ModelFactory, family: str, dtype: torch.dtype
) -> None:
    model_dir = model_factory(family=family)
    # lengths across block boundaries; max_tokens differ, so batches shrink as requests end
    prompts = random_prompts(seed=11, lengths=[5, 16, 17, 40, 3, 33], vocab=2600)
    results = {}
    for native in (True, False):
        engine = _engine(model_dir, dtype, native)
        assert (engine.runner.native_step is not None) == native
        steps = _count_native_steps(engine)
        results[native] = (*_run(engine, prompts), steps[0])
    (fast, fast_logits, fast_steps), (eager, eager_logits, eager_steps) = results.values()
    assert eager_steps == 0
    assert fast_steps >= 12  # every decode-only step: batches of 6 down to 1
    for i in range(len(prompts)):
        rid = f"r{i}"
        assert fast.tokens_of(rid) == eager.tokens_of(rid)
        assert len(fast_logits[rid]) == len(eager_logits[rid]) == 12 + i
        for a, b in zip(fast_logits[rid], eager_logits[rid], strict=True):
            assert torch.equal(a, b)


def test_steps_the_native_call_does_not_take_run_eager(tiny_model_dir: Path) -> None:
    """Prefill steps whose attention is not the native kernel (`prefill_attention: sdpa`), and
    decode steps of more rows than every projection's kernel takes (the limit `native_matmul:
    auto` may set; here 2), stay on the eager path, with the same tokens."""
    engine = _engine(tiny_model_dir, torch.bfloat16, True)
    step = engine.runner.native_step
    assert isinstance(step, NativeDecodeStep)
    step.max_rows = 2
    count = _count_native_steps(engine)
    prompts = random_prompts(seed=3, lengths=[9, 20, 4], vocab=2600)
    out, _ = _run(engine, prompts, max_tokens=4)
    reference, _ = _run(_engine(tiny_model_dir, torch.bfloat16, False), prompts, max_tokens=4)
    # max_tokens 4, 5, 6: three rows for 3 decode steps, two for 1, one for 1
    assert count[0] == 2
    for i in range(3):
        assert out.tokens_of(f"r{i}") == reference.tokens_of(f"r{i}")


def _count_prefill_steps(engine: LLMEngine) -> list[int]:
    """[native steps with prefill chunks, of them with decode rows beside the chunks, with a
    chunk after earlier tokens of its sequence, with the last layer on kept rows]."""
    count = [0, 0, 0, 0]
    step = engine.runner.native_step
    assert step is not None
    forward = step.forward_prefill

    def counting(*args: Any) -> torch.Tensor:
        prefill = args[-1]
        count[0] += 1
        count[1] += prefill.decodes > 0
        count[2] += bool((prefill.chunks.table[:, 2] > 0).any())
        count[3] += prefill.kept is not None
        return forward(*args)

    step.forward_prefill = counting  # type: ignore[method-assign]
    return count


def _wide_heads(model_dir: Path, tmp_path: Path) -> Path:
    """The tiny checkpoint read as 4 query heads and 2 KV heads of 64 (the same weights'
    shapes): the prefill kernel takes head sizes of a multiple of 64 on AVX512-BF16, the tiny
    model's are 32."""
    out = tmp_path / "wide-heads"
    shutil.copytree(model_dir, out)
    config = json.loads((out / "config.json").read_text())
    config.update(num_attention_heads=4, num_key_value_heads=2, head_dim=64)
    (out / "config.json").write_text(json.dumps(config))
    return out


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_steps_with_prefill_chunks_equal_the_eager_steps_bit_for_bit(
    tiny_model_dir: Path, tmp_path: Path, dtype: torch.dtype
) -> None:
    """Steps with prefill chunks through the native call (the prefill kernel's attention, decode
    rows beside the chunks, chunks after earlier chunks of their prompt, the last layer on the
    sampling rows): every sampled logit and prompt logprob the eager steps give, bit for bit.
    Requests arrive over the run, so chunks keep meeting decodes."""
    model_dir = _wide_heads(tiny_model_dir, tmp_path)
    prompts = random_prompts(seed=5, lengths=[70, 12, 45, 3, 90, 33, 17, 61], vocab=2600)
    results = {}
    for native in (True, False):
        engine = _engine(
            model_dir, dtype, native, prefill_attention="matmul", max_num_batched_tokens=40
        )
        assert engine.runner.prefill_kernel is not None
        counts = _count_prefill_steps(engine) if native else [0, 0, 0, 0]
        logits = capture_step_logits(engine)
        collected = Collected()
        for i, prompt in enumerate(prompts):
            # prompt logprobs read every prompt row: that step keeps every row
            extra = {"prompt_logprobs": 2} if i == 5 else {}
            engine.add_request(request(f"r{i}", prompt, max_tokens=6 + i, **extra))
            for _ in range(2):  # the next request arrives two steps later
                step = engine.scheduler.num_steps
                for out in engine.step():
                    collected.add(out, step)
        results[native] = (run_to_completion(engine, collected), logits, counts)
    (fast, fast_logits, counts), (eager, eager_logits, _) = results.values()
    assert counts[0] >= 8 and counts[1] >= 4 and counts[2] >= 2 and counts[3] >= 4, counts
    for i in range(len(prompts)):
        rid = f"r{i}"
        assert fast.tokens_of(rid) == eager.tokens_of(rid)
        assert len(fast_logits[rid]) == len(eager_logits[rid]) == 6 + i
        for a, b in zip(fast_logits[rid], eager_logits[rid], strict=True):
            assert torch.equal(a, b)
    prompt_logprobs = [
        [out.prompt_logprobs for out in c.outputs["r5"] if out.prompt_logprobs]
        for c in (fast, eager)
    ]
    assert prompt_logprobs[0] and prompt_logprobs[0] == prompt_logprobs[1]


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ({"decode_attention": "matmul"}, "decode attention is 'matmul'"),
        ({"fused_layer_ops": False}, "fused layer kernels are off"),
        ({"native_matmul": "off"}, "not in the matmul kernel's layout"),
        ({"family": "qwen3"}, "normalises queries and keys"),
    ],
)
def test_no_native_step_where_a_part_of_the_step_is_not_native(
    model_factory: ModelFactory,
    caplog: pytest.LogCaptureFixture,
    overrides: dict[str, object],
    reason: str,
) -> None:
    family = str(overrides.pop("family", "llama"))
    with caplog.at_level("INFO", logger="engine.step.model_runner"):
        engine = _engine(model_factory(family=family), torch.bfloat16, True, **overrides)
    assert engine.runner.native_step is None
    assert any(reason in record.getMessage() for record in caplog.records)


def test_a_position_out_of_range_raises_and_names_it(tiny_model_dir: Path) -> None:
    engine = _engine(tiny_model_dir, torch.bfloat16, True)
    step = engine.runner.native_step
    assert step is not None
    rows = 2
    args = (
        torch.tensor([1, 2]),
        torch.tensor([0, 10**9]),  # the second row's position is past the rotary table
        torch.tensor([0, 1]),
        torch.zeros(rows, 1, dtype=torch.long),
        torch.tensor([1, 2]),
    )
    with pytest.raises(IndexError, match="out of range"):
        step.forward(*args)


LORA_SPECS = [
    AdapterSpec("r16", r=16, alpha=8, seed=2),
    AdapterSpec("qv", r=16, alpha=32, targets=["q_proj", "v_proj"], seed=6, b_std=0.04),
    AdapterSpec("mlp", r=8, alpha=8, targets=r".*\.mlp\.(gate|up)_proj", seed=7),
    AdapterSpec("partial", r=32, alpha=16, targets=["k_proj", "o_proj", "down_proj"], seed=8),
]


@pytest.mark.skipif(
    not native_rows().runs_bf16,
    reason="this CPU has neither AVX512-BF16 nor AVX2 + FMA: adapter deltas are not computed by "
    "the runs kernel, so adapter steps stay eager",
)
def test_adapter_steps_equal_the_eager_steps_bit_for_bit(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Decode steps whose rows use adapters (each projection's delta by the runs kernel where
    some row's adapter targets it; gate/up's before its SiLU, in two steps) and rows of the
    base model beside them: the same logits as the eager step, every step."""
    adapters = {s.name: make_peft_adapter(tiny_model_dir, tmp_path / s.name, s) for s in LORA_SPECS}
    names: list[str | None] = [None, *adapters]
    prompts = random_prompts(seed=21, lengths=[6, 19, 33, 2, 25, 40, 11, 16], vocab=2600)
    results = {}
    for native in (True, False):
        engine = _engine(
            tiny_model_dir, torch.bfloat16, native, max_lora_rank=32, max_loras=4, max_cpu_loras=4
        )
        assert engine.lora is not None
        for name, path in adapters.items():
            engine.lora.add(name, str(path))
        step = engine.runner.native_step
        assert (step is not None and step.takes_lora) == native
        # the matmuls ask for the runs' stacks as they compute (values untouched: asserted below)
        assert step is None or step.decoder.prefetches_stacks
        steps = _count_native_steps(engine)
        logits = capture_step_logits(engine)
        for i, prompt in enumerate(prompts):
            base = request(f"r{i}", prompt, max_tokens=8 + i)
            engine.add_request(dataclasses.replace(base, adapter_name=names[i % len(names)]))
        results[native] = (run_to_completion(engine), logits, steps[0])
    (fast, fast_logits, fast_steps), (eager, eager_logits, eager_steps) = results.values()
    assert eager_steps == 0 and fast_steps >= 8
    for i in range(len(prompts)):
        rid = f"r{i}"
        assert fast.tokens_of(rid) == eager.tokens_of(rid)
        assert len(fast_logits[rid]) == 8 + i
        for a, b in zip(fast_logits[rid], eager_logits[rid], strict=True):
            assert torch.equal(a, b)
