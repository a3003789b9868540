"""Acceptance 1 and 2: the engine's multi-LoRA batches give PEFT's greedy tokens (fp32).

Eight adapters made by PEFT on the tiny model (ranks 8, 16 and 32, different alphas, one with
use_rslora, one with rank_pattern and alpha_pattern, one on q and v only, one with a regex
target), 32 requests mixing them and the base model, all in flight together. Reference: PEFT
run one request at a time (set_adapter / disable_adapter). Then the same with max_loras=2 and
max_cpu_loras=3, where adapters must swap through the tiers.
"""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from engine.config import EngineConfig
from engine.loop.llm_engine import LLMEngine
from engine.metrics import EngineMetrics
from engine.step.compile_decode import CompiledDecode
from kernels.cpu.rows import NativeRows, native_rows
from tests.engine.engine_helpers import (
    FAST_TOLERANCE,
    REFERENCE_TOLERANCE,
    capture_first_logits,
    random_prompts,
    request,
    run_to_completion,
)
from tests.lora.peft_builders import AdapterSpec, load_base, make_peft_adapter

SPECS = [
    AdapterSpec("r8", r=8, alpha=16, seed=1),
    AdapterSpec("r16", r=16, alpha=8, seed=2),
    AdapterSpec("r32", r=32, alpha=64, seed=3, b_std=0.01),
    AdapterSpec("rslora", r=16, alpha=8, use_rslora=True, seed=4),
    AdapterSpec(
        "pattern",
        r=8,
        alpha=16,
        rank_pattern={"down_proj": 32, "model.layers.1.self_attn.o_proj": 4},
        alpha_pattern={"k_proj": 32},
        seed=5,
    ),
    AdapterSpec("qv", r=16, alpha=32, targets=["q_proj", "v_proj"], seed=6, b_std=0.04),
    AdapterSpec("mlp_regex", r=8, alpha=8, targets=r".*\.mlp\.(gate|up)_proj", seed=7),
    AdapterSpec("r32_partial", r=32, alpha=16, targets=["k_proj", "o_proj", "down_proj"], seed=8),
]
NAMES: list[str | None] = [None] + [s.name for s in SPECS]
NUM_REQUESTS = 32
LENGTHS = [1 + (i * 37) % 90 for i in range(NUM_REQUESTS)]
MAX_TOKENS = [4 + (i * 5) % 13 for i in range(NUM_REQUESTS)]
# every adapter and the base model, interleaved so batches mix them
ADAPTER_OF = [NAMES[i % len(NAMES)] for i in range(NUM_REQUESTS)]
# bf16 activations and weights against float32 PEFT: logits of magnitude ~18 measured 0.2-0.8
# apart for base-model requests and 0.3-1.3 for adapter requests on this model
BF16_TOLERANCE = 2.0


@pytest.fixture(scope="module")
def adapters(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("peft-adapters")
    return {s.name: make_peft_adapter(tiny_model_dir, root / s.name, s) for s in SPECS}


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    # Ids below the tokenizer's size: rows past it are zero (see engine/make_model/weights.py).
    return random_prompts(seed=77, lengths=LENGTHS, vocab=2600)


@dataclasses.dataclass
class Reference:
    tokens: list[list[int]]
    first_logits: list[torch.Tensor]
    base_tokens: list[list[int]]  # the same prompt without an adapter
    base_first_logits: list[torch.Tensor]
    min_margin: float  # smallest top-1 margin over every generated position


@pytest.fixture(scope="module")
def reference(
    tiny_model_dir: Path, adapters: dict[str, Path], prompts: list[list[int]]
) -> Reference:
    """PEFT, one request at a time."""
    from peft import PeftModel

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model: Any = PeftModel.from_pretrained(
            load_base(tiny_model_dir), str(adapters[SPECS[0].name]), adapter_name=SPECS[0].name
        )
        for spec in SPECS[1:]:
            model.load_adapter(str(adapters[spec.name]), adapter_name=spec.name)
    model.eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    ref = Reference([], [], [], [], float("inf"))
    with torch.no_grad():
        for prompt, max_tokens, name in zip(prompts, MAX_TOKENS, ADAPTER_OF, strict=True):
            ids = torch.tensor([prompt])
            with model.disable_adapter():
                base = _generate(model, ids, max_tokens)
            ref.base_tokens.append(base.sequences[0, len(prompt) :].tolist())
            ref.base_first_logits.append(base.scores[0][0].float())
            if name is not None:
                model.set_adapter(name)
                out = _generate(model, ids, max_tokens)
            else:
                out = base
            ref.tokens.append(out.sequences[0, len(prompt) :].tolist())
            ref.first_logits.append(out.scores[0][0].float())
            for score in out.scores:
                top = score[0].float().topk(2).values
                ref.min_margin = min(ref.min_margin, (top[0] - top[1]).item())
    return ref


def _generate(model: Any, ids: torch.Tensor, max_tokens: int) -> Any:
    return model.generate(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        do_sample=False,
        max_new_tokens=max_tokens,
        output_scores=True,
        return_dict_in_generate=True,
    )


def _run_engine(
    model_dir: Path,
    adapters: dict[str, Path],
    prompts: list[list[int]],
    device: str = "cpu",
    dtype: str = "float32",
    **lora: int | bool | str,
) -> tuple[LLMEngine, dict[str, list[int]], dict[str, torch.Tensor], int]:
    engine = LLMEngine(
        EngineConfig(
            model=str(model_dir),
            device=device,
            dtype=dtype,
            num_kv_blocks=512,
            max_num_seqs=NUM_REQUESTS,
            max_num_batched_tokens=256,
            max_lora_rank=32,
            **lora,  # type: ignore[arg-type]
        )
    )
    assert engine.lora is not None
    for name, path in adapters.items():
        engine.lora.add(name, str(path))
    first_logits = capture_first_logits(engine)
    max_distinct = 0
    execute = engine.runner.execute

    def spy(sched):  # type: ignore[no-untyped-def]
        nonlocal max_distinct
        distinct = {s.seq.adapter_id for s in sched.scheduled} - {None}
        max_distinct = max(max_distinct, len(distinct))
        return execute(sched)

    engine.runner.execute = spy  # type: ignore[method-assign]
    for i, prompt in enumerate(prompts):
        base = request(f"r{i}", prompt, max_tokens=MAX_TOKENS[i])
        engine.add_request(dataclasses.replace(base, adapter_name=ADAPTER_OF[i]))
    collected = run_to_completion(engine)
    tokens = {f"r{i}": collected.tokens_of(f"r{i}") for i in range(NUM_REQUESTS)}
    return engine, tokens, first_logits, max_distinct


def _check_parity(
    tokens: dict[str, list[int]],
    first_logits: dict[str, torch.Tensor],
    ref: Reference,
    tolerance: float = FAST_TOLERANCE,
) -> None:
    assert ref.min_margin > 1e-3, f"reference top-1 margin {ref.min_margin} is too small"
    for i in range(NUM_REQUESTS):
        label = f"request {i} (adapter {ADAPTER_OF[i]}, prompt length {LENGTHS[i]})"
        assert tokens[f"r{i}"] == ref.tokens[i], label
        diff = (first_logits[f"r{i}"].cpu() - ref.first_logits[i]).abs().max().item()
        assert diff < tolerance, f"{label}: first-step logits differ by {diff}"


def test_adapters_change_the_output(reference: Reference) -> None:
    """Not vacuous: every adapter moves the logits, and most change the greedy tokens."""
    moved, changed = set(), set()
    for i, name in enumerate(ADAPTER_OF):
        if name is None:
            assert reference.tokens[i] == reference.base_tokens[i]
            continue
        shift = (reference.first_logits[i] - reference.base_first_logits[i]).abs().max().item()
        if shift > 0.05:
            moved.add(name)
        if reference.tokens[i] != reference.base_tokens[i]:
            changed.add(name)
    assert moved == {s.name for s in SPECS}, moved
    assert len(changed) >= 6, changed


@pytest.mark.parametrize(
    "enforce_eager, fast", [(True, True), (True, False), (False, True)],
    ids=["eager", "eager-reference-layers", "compiled"],
)  # fmt: skip
def test_mixed_adapters_match_peft(
    tiny_model_dir, tmp_path, monkeypatch, adapters, prompts, reference, enforce_eager, fast
):
    """Compiled: decode steps with no adapter row run the compiled forward (engine/
    compile_decode.py), steps with one run eager, on one KV cache. Reference layers: PyTorch
    operators and plain weights (tests/engine/engine_helpers.py, the tolerances)."""
    compiled_rows: list[int] = []
    forward = CompiledDecode.forward

    def counting(self, input_ids, *rest):  # type: ignore[no-untyped-def]
        compiled_rows.append(input_ids.shape[0])
        return forward(self, input_ids, *rest)

    monkeypatch.setattr(CompiledDecode, "forward", counting)
    engine, tokens, first_logits, max_distinct = _run_engine(
        tiny_model_dir,
        adapters,
        prompts,
        max_loras=8,
        max_cpu_loras=8,
        enforce_eager=enforce_eager,
        compile_cache_dir=str(tmp_path),
        fused_layer_ops=fast,
        prepack_weights=fast,
    )
    _check_parity(
        tokens, first_logits, reference, tolerance=FAST_TOLERANCE if fast else REFERENCE_TOLERANCE
    )
    assert max_distinct == len(SPECS)  # all eight adapters really shared batches
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    assert bool(compiled_rows) == (not enforce_eager)


def test_two_slots_three_cpu_same_tokens_and_swaps(tiny_model_dir, adapters, prompts, reference):
    engine, tokens, first_logits, max_distinct = _run_engine(
        tiny_model_dir, adapters, prompts, max_loras=2, max_cpu_loras=3
    )
    _check_parity(tokens, first_logits, reference)
    assert max_distinct <= 2
    stats = engine.stats().lora
    assert stats is not None
    assert stats.gpu_evictions_total > 0 and stats.cpu_evictions_total > 0
    assert stats.loads_total > 0 and stats.gpu_misses_total >= len(SPECS)
    text = _metrics_text(engine)
    assert 'loragate_engine_adapter_evictions_total{model_name="tiny",tier="gpu"}' in text


def _metrics_text(engine: LLMEngine) -> str:
    from prometheus_client import generate_latest

    metrics = EngineMetrics(model_name="tiny", stats=engine.stats)
    return generate_latest(metrics.registry).decode()


@pytest.mark.gpu
def test_cuda_kernels_match_peft(tiny_model_dir, adapters, prompts, reference):
    """The same on CUDA: Triton kernels (gathered decode rows, segmented prefill rows), pinned
    CPU payloads, slots swapping. Logits within 1e-3: Triton's fp32 dot may use TF32."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    _, tokens, first_logits, max_distinct = _run_engine(
        tiny_model_dir, adapters, prompts, device="cuda", max_loras=2, max_cpu_loras=3
    )
    _check_parity(tokens, first_logits, reference, tolerance=1e-3)
    assert max_distinct <= 2


def test_bf16_engine_applies_every_adapter(
    tiny_model_dir: Path,
    adapters: dict[str, Path],
    prompts: list[list[int]],
    reference: Reference,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A bf16 engine's LoRA (on a CPU with AVX512-BF16 or AVX2 + FMA: every run of a step
    through the tiled kernel, kernels/cpu/native/lora_runs.h; elsewhere the row kernel and BLAS): each request's
    first-step logits stay within bf16 rounding of PEFT's float32 ones for its adapter, and
    at most half as far from them as from the base model's."""
    ran: list[bool] = []
    run_segments = NativeRows.run_segments

    def spy(self: NativeRows, *args: Any) -> bool:
        ran.append(run_segments(self, *args))
        return ran[-1]

    monkeypatch.setattr(NativeRows, "run_segments", spy)
    _, _, first_logits, _ = _run_engine(tiny_model_dir, adapters, prompts, dtype="bfloat16")
    assert ran and all(ran) == native_rows().runs_bf16
    for i, name in enumerate(ADAPTER_OF):
        got, want = first_logits[f"r{i}"].float(), reference.first_logits[i]
        error = (got - want).abs().max().item()
        assert error < BF16_TOLERANCE, f"r{i} ({name}): bf16 logits {error} from PEFT's"
        if name is not None:
            from_base = (got - reference.base_first_logits[i]).abs().max().item()
            # the adapter moves these logits by 1.7-15 here; bf16 rounding moves them by 0.3-1.3
            assert 2 * error < from_base, f"r{i} ({name}): {error} from PEFT, {from_base} from base"
