"""The decode-row kernel in the engine (engine/decode_gemv.py, engine/packed_linear.py): which
rows it takes, how the start-up choice is made (timing, memory, mode), and an engine whose
decode steps run it giving what the oneDNN engine gives, to bf16 rounding."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from engine import decode_gemv
from engine.config import EngineConfig
from engine.decode_gemv import use_decode_gemv
from engine.llm_engine import LLMEngine
from engine.packed_linear import PackedLinear, can_pack, pack_linears
from kernels.cpu_gemv import NativeGemv, native_gemv
from tests.engine.engine_helpers import random_prompts, request, run_to_completion

pytestmark = pytest.mark.skipif(
    not (native_gemv().available and can_pack(torch.bfloat16, torch.device("cpu"))),
    reason="this CPU has no AVX512-BF16: the kernel is unavailable and the engine keeps oneDNN",
)


def _packed_model(bias: bool = False) -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 192, bias=bias), nn.Linear(192, 100, bias=bias))
    model = model.to(torch.bfloat16)
    assert pack_linears(model) == 2
    return model


def _installed(model: nn.Module) -> list[bool]:
    return [m.gemv is not None for m in model.modules() if isinstance(m, PackedLinear)]


@pytest.mark.parametrize("bias", [False, True])
def test_few_rows_go_to_the_kernel_more_to_onednn(bias: bool) -> None:
    layer = _packed_model(bias)[0]
    weight = layer.weight()
    layer.use_gemv(native_gemv())
    for rows in (1, 2, 3, 64):
        x = torch.randn(rows, 64).bfloat16()
        y = layer(x)
        if rows <= 2:
            assert layer.gemv is not None
            kernel, packed = layer.gemv
            assert torch.equal(y, kernel(x, packed, 192, layer.bias))
        else:  # oneDNN, bit for bit F.linear here
            assert torch.equal(y, F.linear(x, weight, layer.bias))
    assert layer(torch.empty(0, 64).bfloat16()).shape == (0, 192)  # no rows: oneDNN
    layer.use_gemv(None)
    assert layer.gemv is None


def test_auto_keeps_the_kernel_only_where_it_is_faster(monkeypatch: pytest.MonkeyPatch) -> None:
    model = _packed_model()
    monkeypatch.setattr(decode_gemv, "_time_one_row", lambda linears, gemv: (1.0, 0.5))
    used, why = use_decode_gemv(model, "auto", torch.bfloat16)
    assert used and _installed(model) == [True, True] and "kernel 500.00 ms" in why
    monkeypatch.setattr(decode_gemv, "_time_one_row", lambda linears, gemv: (1.0, 0.99))
    used, why = use_decode_gemv(model, "auto", torch.bfloat16)
    assert not used and _installed(model) == [False, False]  # the copies are dropped again


def test_auto_leaves_it_where_the_copy_would_not_fit(monkeypatch: pytest.MonkeyPatch) -> None:
    model = _packed_model()
    monkeypatch.setattr(decode_gemv, "_time_one_row", lambda linears, gemv: (1.0, 0.5))
    monkeypatch.setattr(decode_gemv, "_free_memory", lambda: 4 * 64 * 192 * 2)  # < 4x the copy
    used, why = use_decode_gemv(model, "auto", torch.bfloat16)
    assert not used and "free memory" in why and _installed(model) == [False, False]
    used, _ = use_decode_gemv(model, "on", torch.bfloat16)  # asked for: no memory check
    assert used and _installed(model) == [True, True]


def test_modes_and_their_errors() -> None:
    model = _packed_model()
    assert use_decode_gemv(model, "off", torch.bfloat16) == (False, "off")
    with pytest.raises(ValueError, match="decode_gemv must be one of"):
        use_decode_gemv(model, "always", torch.bfloat16)
    with pytest.raises(ValueError, match="decode_gemv 'on': the kernel is bf16 only"):
        use_decode_gemv(model, "on", torch.float32)
    with pytest.raises(ValueError, match="decode_gemv 'on': no packed linear layers"):
        use_decode_gemv(nn.Sequential(nn.ReLU()), "on", torch.bfloat16)
    assert use_decode_gemv(nn.Sequential(nn.ReLU()), "auto", torch.bfloat16)[0] is False
    with pytest.raises(ValueError, match="decode_gemv"):
        EngineConfig(model="m", decode_gemv="yes")


def _engine(model_dir: Path, mode: str) -> LLMEngine:
    return LLMEngine(
        EngineConfig(
            model=str(model_dir),
            dtype="bfloat16",
            num_kv_blocks=256,
            max_num_seqs=2,  # decode steps of 1-2 rows: every one runs the kernel when on
            max_num_batched_tokens=128,
            decode_attention="matmul",
            prefill_attention="sdpa",
            decode_gemv=mode,
        )
    )


def test_an_engine_on_the_kernel_decodes_as_the_onednn_engine(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = 0
    kernel_call = NativeGemv.__call__

    def counted(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        nonlocal calls
        calls += 1
        return kernel_call(self, *args, **kwargs)

    monkeypatch.setattr(NativeGemv, "__call__", counted)
    prompts = random_prompts(seed=5, lengths=[7, 30, 18, 51], vocab=2600)
    results = {}
    for mode in ("off", "on"):
        engine = _engine(tiny_model_dir, mode)
        assert engine.decode_gemv == (mode == "on")
        logits: dict[str, list[torch.Tensor]] = {}
        execute = engine.runner.execute

        def spy(sched, logits=logits, execute=execute):  # type: ignore[no-untyped-def]
            forward = execute(sched)
            for seq, row in zip(forward.sampling_seqs, forward.logits, strict=True):
                logits.setdefault(seq.request.request_id, []).append(row.float().clone())
            return forward

        engine.runner.execute = spy  # type: ignore[method-assign]
        calls = 0
        for i, prompt in enumerate(prompts):
            engine.add_request(request(f"r{i}", prompt, max_tokens=10))
        collected = run_to_completion(engine)
        results[mode] = (collected, logits, calls)
    assert results["off"][2] == 0
    # on: 4 projections a layer + the lm_head, every decode step (9 a request, up to 2 rows)
    assert results["on"][2] >= 9 * (4 * 8 + 1)
    for i in range(len(prompts)):
        rid = f"r{i}"
        off, on = results["off"][0].tokens_of(rid), results["on"][0].tokens_of(rid)
        # Step by step while the two agree on the tokens so far, the logits agree to bf16
        # rounding (a near tie may then pick another token; nothing after it is compared).
        pairs = zip(results["off"][1][rid], results["on"][1][rid], strict=True)
        for step, (a, b) in enumerate(pairs):
            torch.testing.assert_close(b, a, atol=0.1, rtol=2**-5)
            if off[step] != on[step]:
                break
    same = sum(
        results["off"][0].tokens_of(f"r{i}") == results["on"][0].tokens_of(f"r{i}")
        for i in range(len(prompts))
    )
    assert same >= len(prompts) - 1
