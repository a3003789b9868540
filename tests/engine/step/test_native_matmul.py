"""The matmul kernel in the engine (engine/step/native_matmul.py, engine/step/packed_linear.py): which
rows it takes, the reference copy (oneDNN's, or the plain weight where oneDNN has no kernels for
the dtype) dropped when it takes every row, how the start-up choice is made (timing, memory,
mode), and an engine on it giving what the reference engine gives, to the dtype's rounding.
bf16 runs wherever the kernel has a bf16 path (AVX512-BF16, AMX, or AVX2's FMA path), float32
where it has the FMA path."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from engine.config import EngineConfig
from engine.loop.llm_engine import LLMEngine
from engine.step import native_matmul
from engine.step.native_matmul import TIMED_ROWS, NativeMatmulUse, use_native_matmul
from engine.step.packed_linear import PackedLinear, can_pack, pack_linears
from kernels.cpu.layer import native_layer
from kernels.cpu.matmul import NativeMatmul
from kernels.cpu.matmul import native_matmul as kernel_of
from tests.engine.engine_helpers import (
    capture_step_logits,
    random_prompts,
    request,
    run_to_completion,
)

pytestmark = pytest.mark.skipif(
    not kernel_of().available,
    reason="this CPU has neither AVX512-BF16 nor AVX2 + FMA: no kernel, the engine keeps oneDNN",
)
CPU = torch.device("cpu")
# the dtypes the kernel multiplies in on this CPU
DTYPES = [d for d in (torch.bfloat16, torch.float32) if kernel_of().takes(d)]


def _packed_model(bias: bool = False, dtype: torch.dtype = torch.bfloat16) -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 192, bias=bias), nn.Linear(192, 100, bias=bias))
    model = model.to(dtype)
    assert pack_linears(model, onednn=can_pack(dtype, CPU)) == 2
    return model


def _close(y: torch.Tensor, reference: torch.Tensor) -> None:
    """Two matmuls summing in different orders: a step of bf16, or float32 sums' error."""
    if y.dtype is torch.bfloat16:
        torch.testing.assert_close(y, reference, atol=0.05, rtol=2**-7)
    else:
        torch.testing.assert_close(y, reference, atol=1e-5, rtol=1e-5)


def _state(model: nn.Module) -> list[tuple[bool, bool]]:
    """(kernel installed, oneDNN copy kept) for each packed linear."""
    linears = [m for m in model.modules() if isinstance(m, PackedLinear)]
    return [(m.native is not None, m.packed_weight is not None) for m in linears]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias", [False, True])
def test_rows_up_to_the_limit_go_to_the_kernel_more_to_onednn(
    bias: bool, dtype: torch.dtype
) -> None:
    layer = _packed_model(bias, dtype)[0]
    weight = layer.weight()
    layer.use_native(kernel_of(), max_rows=8)
    assert layer.packed_weight is not None  # both copies
    for rows in (1, 8, 9, 64):
        x = torch.randn(rows, 64).to(dtype)
        y = layer(x)
        if rows <= 8:
            assert layer.native is not None
            kernel, packed = layer.native
            assert torch.equal(y, kernel(x, packed, 192, layer.bias))
        else:  # the reference: oneDNN (bit for bit F.linear in bf16), or F.linear itself
            if dtype is torch.bfloat16:
                assert torch.equal(y, F.linear(x, weight, layer.bias))
            else:
                _close(y, F.linear(x, weight, layer.bias))
    layer.use_native(None)
    assert layer.native is None and torch.equal(layer.weight(), weight)


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_row_on_the_kernel_drops_onednns_copy_and_can_get_it_back(
    dtype: torch.dtype,
) -> None:
    layer = _packed_model(bias=True, dtype=dtype)[0]
    weight = layer.weight()
    layer.use_native(kernel_of(), max_rows=None)
    assert layer.packed_weight is None and torch.equal(layer.weight(), weight)  # from its layout
    assert "native" in repr(layer)
    x = torch.randn(300, 64).to(dtype)
    _close(layer(x), F.linear(x, weight, layer.bias))
    layer.use_native(None)  # the reference alone again, repacked from the kernel's copy
    assert layer.packed_weight is not None and layer.native is None
    _close(layer(x), F.linear(x, weight, layer.bias))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias", [False, True])
def test_a_gate_up_projection_applies_its_silu_in_the_same_pass(
    bias: bool, dtype: torch.dtype
) -> None:
    torch.manual_seed(1)
    linear = nn.Linear(64, 2 * 96, bias=bias).to(dtype)
    onednn = can_pack(dtype, CPU)
    layer = PackedLinear(linear, onednn=onednn)
    weight = layer.weight()
    assert layer.silu_forward(torch.randn(3, 64).to(dtype)) is None  # reference: not laid out
    layer.use_native(kernel_of(), max_rows=None, gate_up_width=96)
    assert torch.equal(layer.weight(), weight)  # the interleaved copy reads back in order
    plain = PackedLinear(linear, onednn=onednn)
    plain.use_native(kernel_of(), max_rows=None)
    for rows in (1, 7, 70):
        x = torch.randn(rows, 64).to(dtype)
        assert torch.equal(layer(x), plain(x))  # outputs in [gate | up] order
        fused = layer.silu_forward(x)
        assert fused is not None and torch.equal(fused, native_layer().silu_mul(plain(x)))
    # beside oneDNN (steps up to 8 rows): the kernel's copy interleaved, oneDNN's plain
    layer.use_native(kernel_of(), max_rows=8, gate_up_width=96)
    assert layer.packed_weight is not None and torch.equal(layer.weight(), weight)
    x = torch.randn(8, 64).to(dtype)
    fused = layer.silu_forward(x)
    assert fused is not None and torch.equal(fused, native_layer().silu_mul(plain(x)))
    x = torch.randn(9, 64).to(dtype)
    assert layer.silu_forward(x) is None  # the reference's step: the two steps
    _close(layer(x), F.linear(x, weight, layer.bias))
    with pytest.raises(ValueError, match="needs the kernel"):
        layer.use_native(None, max_rows=8, gate_up_width=96)
    layer.use_native(None)  # back to oneDNN: the plain weight again
    assert layer.gate_up_width is None and torch.equal(layer.weight(), weight)


def _ratios(values: dict[int, float]):  # type: ignore[no-untyped-def]
    return lambda linears, rows, gate_up: values[rows]


def test_auto_takes_every_row_where_the_kernel_keeps_up(monkeypatch: pytest.MonkeyPatch) -> None:
    model = _packed_model()
    monkeypatch.setattr(
        native_matmul,
        "_ratio",
        _ratios({1: 1.4, 8: 1.2, 64: 1.0, 512: 0.98, 1024: 0.98, 2048: 0.99}),
    )
    use = use_native_matmul(model, "auto", torch.bfloat16)
    assert use.max_rows is None and use.used and use.describe() == "every step"
    assert "512 rows 0.98" in use.why
    assert _state(model) == [(True, False), (True, False)]  # one copy: the kernel's
    # the largest step (a full prefill chunk) decides too: slower there, both copies
    model = _packed_model()
    monkeypatch.setattr(
        native_matmul,
        "_ratio",
        _ratios({1: 1.4, 8: 1.2, 64: 1.16, 512: 1.03, 1024: 0.97, 2048: 0.63}),
    )
    use = use_native_matmul(model, "auto", torch.bfloat16)
    assert use.max_rows == 512 and "1024 rows 0.97" in use.why
    # a tie within the noise at one size does not stop a lead beyond it
    model = _packed_model()
    monkeypatch.setattr(
        native_matmul,
        "_ratio",
        _ratios({1: 1.4, 8: 1.2, 64: 1.16, 512: 0.99, 1024: 1.1, 2048: 0.63}),
    )
    assert use_native_matmul(model, "auto", torch.bfloat16).max_rows == 1024
    assert _state(model) == [(True, True), (True, True)]


def test_auto_keeps_both_copies_where_the_kernel_wins_only_at_few_rows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model = _packed_model()
    monkeypatch.setattr(
        native_matmul, "_ratio", _ratios({1: 1.4, 8: 1.1, 64: 0.9, 512: 0.5, 1024: 0.5, 2048: 0.5})
    )
    use = use_native_matmul(model, "auto", torch.bfloat16)
    assert use.max_rows == 8 and use.describe() == "steps of up to 8 rows"
    assert _state(model) == [(True, True), (True, True)]
    assert all(m.native_rows == 8 for m in model.modules() if isinstance(m, PackedLinear))
    # slower even at one row: oneDNN alone, the kernel's copies dropped
    monkeypatch.setattr(
        native_matmul, "_ratio", _ratios({1: 1.01, 8: 1.1, 64: 0.9, 512: 0.5, 1024: 0.5, 2048: 0.5})
    )
    use = use_native_matmul(model, "auto", torch.bfloat16)
    assert use.max_rows == 0 and not use.used and use.describe() == "no"
    assert _state(model) == [(False, True), (False, True)]


def test_auto_keeps_one_copy_where_two_would_not_fit(monkeypatch: pytest.MonkeyPatch) -> None:
    model = _packed_model()
    timed: list[int] = []

    def ratio(linears, rows, gate_up):  # type: ignore[no-untyped-def]
        timed.append(len(linears))
        return {1: 1.4, 8: 1.1, 64: 0.9, 512: 0.5, 1024: 0.5, 2048: 0.5}[rows]

    monkeypatch.setattr(native_matmul, "_ratio", ratio)
    monkeypatch.setattr(native_matmul, "_free_memory", lambda: 4 * 64 * 192 * 2)  # < 4x a copy
    use = use_native_matmul(model, "auto", torch.bfloat16)
    assert use.max_rows == 0 and "free memory" in use.why
    assert _state(model) == [(False, True), (False, True)]
    assert timed == [2] * len(TIMED_ROWS)  # at most the first layer's projections (here: both)
    assert use_native_matmul(model, "on", torch.bfloat16).max_rows is None  # asked: no check
    assert _state(model) == [(True, False), (True, False)]


def test_modes_and_their_errors() -> None:
    model = _packed_model()
    assert use_native_matmul(model, "off", torch.bfloat16) == NativeMatmulUse(0, "off")
    with pytest.raises(ValueError, match="native_matmul must be one of"):
        use_native_matmul(model, "always", torch.bfloat16)
    with pytest.raises(ValueError, match="native_matmul 'on': the kernel is bf16 or float32"):
        use_native_matmul(model, "on", torch.float16)
    with pytest.raises(ValueError, match="native_matmul 'on': no packed linear layers"):
        use_native_matmul(nn.Sequential(nn.ReLU()), "on", torch.bfloat16)
    assert not use_native_matmul(nn.Sequential(nn.ReLU()), "auto", torch.bfloat16).used
    with pytest.raises(ValueError, match="native_matmul"):
        EngineConfig(model="m", native_matmul="yes")


def test_the_timing_compares_the_same_matmuls() -> None:
    model = _packed_model()
    linears = [m for m in model.modules() if isinstance(m, PackedLinear)]
    for m in linears:
        m.use_native(kernel_of(), max_rows=0)  # both copies, as while timing
    onednn, kernel = native_matmul.matmul_steps(linears, rows=3)
    onednn(), kernel()  # both run on every linear
    assert native_matmul._ratio(linears, 8, {}) > 0


def test_the_timing_runs_a_fused_gate_up_projection_with_its_silu(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As a step runs it: the kernel's one pass with the SiLU against the reference matmul
    (oneDNN's, or F.linear where oneDNN has no bf16 kernels: AVX2) and then silu_mul (what the
    step would run beside it)."""
    torch.manual_seed(0)
    gate_up = PackedLinear(
        nn.Linear(64, 128, bias=False).to(torch.bfloat16), onednn=can_pack(torch.bfloat16, CPU)
    )
    gate_up.use_native(kernel_of(), max_rows=0, gate_up_width=64)
    kernel = gate_up.native[0] if gate_up.native is not None else None
    assert kernel is not None
    calls: list[str] = []
    silu = kernel.silu
    monkeypatch.setattr(kernel, "silu", lambda *a: calls.append("fused") or silu(*a))
    monkeypatch.setattr(
        native_matmul, "_silu_mul", lambda: lambda y, width: calls.append(f"silu_mul {width}")
    )
    onednn, fused = native_matmul.matmul_steps([gate_up], rows=5, gate_up={id(gate_up): 64})
    onednn(), fused()
    assert calls == ["silu_mul 64", "fused"]


def _engine(model_dir: Path, mode: str, dtype: str = "bfloat16") -> LLMEngine:
    return LLMEngine(
        EngineConfig(
            model=str(model_dir),
            dtype=dtype,
            num_kv_blocks=256,
            max_num_seqs=2,
            max_num_batched_tokens=128,
            decode_attention="matmul",
            prefill_attention="sdpa",
            native_matmul=mode,
        )
    )


def _run(engine: LLMEngine, prompts: list[list[int]]):  # type: ignore[no-untyped-def]
    """The engine's tokens and every sampling step's logits (float32), per request."""
    logits = capture_step_logits(engine)
    for i, prompt in enumerate(prompts):
        engine.add_request(request(f"r{i}", prompt, max_tokens=10))
    return run_to_completion(engine), logits


def test_an_engine_on_the_kernel_is_as_close_to_float32_as_the_onednn_engine(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both bf16 engines round every matmul once, summing in different orders, so their logits
    differ by bf16 noise that grows through the layers (on this random tiny model's near ties
    that flips tokens, so tokens are not compared); the claim is that the kernel's noise is no
    larger than oneDNN's: both are compared with a float32 engine on the same weights."""
    calls = 0
    kernel_call = NativeMatmul.__call__

    def counted(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        nonlocal calls
        calls += 1
        return kernel_call(self, *args, **kwargs)

    monkeypatch.setattr(NativeMatmul, "__call__", counted)
    prompts = random_prompts(seed=5, lengths=[7, 30, 18, 51], vocab=2600)
    runs, counts = {}, {}
    for mode, dtype in (("off", "bfloat16"), ("on", "bfloat16"), ("off", "float32")):
        engine = _engine(tiny_model_dir, mode, dtype)
        assert engine.native_matmul.used == (mode == "on")
        fused = [
            m.gate_up_width for m in engine.runner.model.modules() if isinstance(m, PackedLinear)
        ]
        # on: every layer's gate/up projection laid out for its SiLU, and nothing else
        assert sum(w is not None for w in fused) == (8 if mode == "on" else 0)
        calls = 0
        runs[mode, dtype] = _run(engine, prompts)
        counts[mode, dtype] = calls
    assert counts["off", "bfloat16"] == 0 == counts["off", "float32"]
    # on: 4 projections a layer + the lm_head, every step (10 steps a request at least)
    assert counts["on", "bfloat16"] >= 10 * (4 * 8 + 1)
    (off, off_logits), (on, on_logits), (ref, ref_logits) = runs.values()
    error = {"off": 0.0, "on": 0.0}
    for i in range(len(prompts)):
        rid = f"r{i}"
        # step by step while all three agree on the tokens so far (a near tie may then pick
        # another token; nothing after it is compared)
        steps = zip(off_logits[rid], on_logits[rid], ref_logits[rid], strict=True)
        for step, (a, b, exact) in enumerate(steps):
            error["off"] = max(error["off"], (a - exact).abs().max().item())
            error["on"] = max(error["on"], (b - exact).abs().max().item())
            if (
                len({off.tokens_of(rid)[step], on.tokens_of(rid)[step], ref.tokens_of(rid)[step]})
                > 1
            ):
                break
    assert 0 < error["on"] <= 1.5 * error["off"] + 0.02, error
