"""Pre-packed linears (engine/step/packed_linear.py) against plain F.linear, the reference.

The layer alone: same values over decode-sized and prefill-sized inputs. The engine: every
projection (the LoRA wrappers' base layers too) packed, the plain weights gone, and the same
greedy tokens as an engine with `prepack_weights=False`, base model and adapters mixed in one
batch. In bf16 both paths accumulate in float32 through oneDNN and round once to bf16; on an
AVX512-BF16 EPYC they agreed bit for bit, but on an AMX Xeon oneDNN's packed and plain
matmuls sum in different orders, and on this random tiny model a near tie then flips a token.
So in bf16 the tokens must agree up to a near tie (the two picks within the runs' logit
difference of each other) and the logits stay close until then; float32 must agree exactly.
The bf16 tests need oneDNN's bf16 support and skip (saying so) without it; float32 runs
on every x86 CPU, packed whether or not the start-up timing would pack it here.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from engine.config import EngineConfig
from engine.loop.llm_engine import LLMEngine
from engine.step.packed_linear import PackedLinear, can_pack, pack_linears, packing_pays
from lora.layers import LoRALinear
from tests.engine.engine_helpers import (
    capture_step_logits,
    random_prompts,
    request,
    run_to_completion,
)
from tests.lora.peft_builders import AdapterSpec, make_peft_adapter

CPU = torch.device("cpu")

BF16 = pytest.param(
    torch.bfloat16,
    marks=pytest.mark.skipif(
        not can_pack(torch.bfloat16, CPU),
        reason="this CPU has no oneDNN bf16 support (AVX512-BF16 or AMX): bf16 is not packed here",
    ),
)
DTYPES = [BF16, torch.float32]
TOLERANCE = {torch.bfloat16: {"rtol": 1.6e-2, "atol": 1e-2}, torch.float32: {}}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, 3, 64, 300])
@pytest.mark.parametrize("bias", [False, True])
def test_packed_equals_f_linear(rows: int, bias: bool, dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(rows)
    linear = nn.Linear(96, 160, bias=bias).to(dtype)
    x = torch.randn(rows, 2 * 96, generator=gen).to(dtype)[:, ::2]  # not contiguous
    expected = F.linear(x, linear.weight, linear.bias)
    packed = PackedLinear(linear)
    torch.testing.assert_close(packed(x), expected, **TOLERANCE[dtype])
    assert list(packed.parameters()) == []  # the plain weight is not kept beside the packed one


def test_cuda_and_float16_are_not_packed() -> None:
    assert not can_pack(torch.bfloat16, torch.device("cuda"))
    assert not can_pack(torch.float32, torch.device("cuda"))
    assert not can_pack(torch.float16, CPU)


def test_packing_pays_times_float32_and_always_packs_bf16() -> None:
    model = nn.Sequential(nn.Linear(64, 256), nn.Linear(256, 64))
    pays, figures = packing_pays(model, torch.float32)
    assert isinstance(pays, bool)
    assert "256x64" in figures and "plain" in figures and "packed" in figures
    assert packing_pays(model.to(torch.bfloat16), torch.bfloat16)[0]


def _engine(model_dir: Path, *, prepack: bool, dtype: str = "bfloat16") -> LLMEngine:
    # Attention forms pinned: timed at start-up on a loaded machine, two engines could pick
    # different ones, which round differently in bf16 and can flip a near-tie token.
    return LLMEngine(
        EngineConfig(
            model=str(model_dir),
            dtype=dtype,
            decode_attention="matmul",
            prefill_attention="sdpa",
            native_matmul="off",  # oneDNN's matmuls alone: the kernel rounds its own way
            num_kv_blocks=256,
            max_num_seqs=16,
            max_num_batched_tokens=128,
            prepack_weights=prepack,
        )
    )


@pytest.mark.parametrize("dtype", DTYPES)
def test_engine_packs_every_projection_and_keeps_the_tokens(
    tiny_model_dir: Path, tmp_path: Path, dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    # float32 packs where the start-up timing says it pays; here it is packed either way
    monkeypatch.setattr(
        "engine.step.native_matmul.packing_pays", lambda model, dtype: (True, "test")
    )
    specs = [AdapterSpec("a", r=8, alpha=16, seed=1), AdapterSpec("b", r=16, alpha=8, seed=2)]
    adapters = {s.name: make_peft_adapter(tiny_model_dir, tmp_path / s.name, s) for s in specs}
    # Each prompt twice: once on the base model, once with an adapter.
    distinct = random_prompts(seed=3, lengths=[5, 17, 40, 63], vocab=2600)
    prompts = [p for p in distinct for _ in (0, 1)]
    names = [None, "a", None, "b", None, "a", None, "b"]
    tokens, logits = {}, {}
    for prepack in (False, True):
        engine = _engine(tiny_model_dir, prepack=prepack, dtype=str(dtype).removeprefix("torch."))
        model = engine.runner.model
        num_layers = engine.model_config.num_layers
        if prepack:
            assert engine.packed_linears == 4 * num_layers + 1  # 4 projections + lm_head
            assert not any(type(m) is nn.Linear for m in model.modules())
            wrapped = [m for m in model.modules() if isinstance(m, LoRALinear)]
            assert wrapped and all(isinstance(m.base, PackedLinear) for m in wrapped)
        else:
            assert engine.packed_linears == 0
        assert engine.lora is not None
        for name, path in adapters.items():
            engine.lora.add(name, str(path))
        logits[prepack] = capture_step_logits(engine)
        for i, (prompt, name) in enumerate(zip(prompts, names, strict=True)):
            base = request(f"r{i}", prompt, max_tokens=12)
            engine.add_request(dataclasses.replace(base, adapter_name=name))
        collected = run_to_completion(engine)
        tokens[prepack] = [collected.tokens_of(f"r{i}") for i in range(len(prompts))]
    assert all(len(t) == 12 for t in tokens[True])
    if dtype is torch.float32:
        assert tokens[True] == tokens[False]
    else:
        _agree_up_to_a_near_tie(tokens, logits)
    # The adapters changed tokens, so the comparison covers the LoRA path too.
    pairs = zip(tokens[True][0::2], tokens[True][1::2], strict=True)
    assert sum(base != adapted for base, adapted in pairs) >= 2


def test_float32_engine_packs_only_where_packing_pays(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        "engine.step.native_matmul.packing_pays", lambda model, dtype: (False, "test")
    )
    engine = _engine(tiny_model_dir, prepack=True, dtype="float32")
    assert engine.packed_linears == 0
    assert any(type(m) is nn.Linear for m in engine.runner.model.modules())


def test_pack_linears_counts_what_it_replaced() -> None:
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Sequential(nn.Linear(8, 4)))
    assert pack_linears(model) == 2
    assert pack_linears(model) == 0  # nothing plain left


def _agree_up_to_a_near_tie(
    tokens: dict[bool, list[list[int]]], logits: dict[bool, dict[str, list[torch.Tensor]]]
) -> None:
    """Per request, step by step: the two runs' logits within bf16 noise of each other, the
    same token, or, at the first step they differ (nothing after it is compared), a near tie:
    each run's pick scores within the logits' difference of the other run's pick."""
    for i, (packed, plain) in enumerate(zip(tokens[True], tokens[False], strict=True)):
        steps = zip(logits[True][f"r{i}"], logits[False][f"r{i}"], strict=True)
        for step, (a, b) in enumerate(steps):
            noise = (a - b).abs().max().item()
            assert noise <= 0.05 * b.abs().max().item() + 1e-3, (i, step, noise)
            if packed[step] != plain[step]:
                assert a[plain[step]] >= a.max() - 2 * noise, (i, step, noise)
                assert b[packed[step]] >= b.max() - 2 * noise, (i, step, noise)
                break
