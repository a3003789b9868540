"""lora/layers.py and lora/batch.py: the fused wrapper adds exactly each token's own adapter
delta (mixed ranks, untargeted sub-projections, base tokens, decode and prefill parts), and a
batch without adapters runs no LoRA op at all."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from kernels.cpu import huge_pages
from kernels.cpu.gathered import compiled_gathered_rows, gathered_rows
from kernels.cpu.native.build import NativeBuildError
from kernels.cpu.rows import native_rows
from lora.adapter_format import PeftLoraConfig
from lora.batch import NO_SLOT, build_lora_batch
from lora.dims import BaseModelDims
from lora.layers import LoRALayers
from lora.loader import LoadedAdapter, LoraWeights

DIMS = BaseModelDims(num_layers=2, hidden_size=32, q_size=32, kv_size=16, intermediate_size=48)
LAYOUT = {"attn.qkv": ("q_proj", "k_proj", "v_proj"), "mlp.down": ("down_proj",)}
MAX_RANK = 8


class Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = nn.Module()
        self.attn.qkv = nn.Linear(32, 32 + 2 * 16)
        self.mlp = nn.Module()
        self.mlp.down = nn.Linear(48, 32)


def adapter(seed: int, rank: int, modules: dict[str, int]) -> LoadedAdapter:
    gen = torch.Generator().manual_seed(seed)
    weights = {}
    for layer in range(2):
        for module, r in modules.items():
            d_in, d_out = DIMS.in_out(module)
            weights[(layer, module)] = LoraWeights(
                torch.randn(r, d_in, generator=gen), torch.randn(d_out, r, generator=gen)
            )
    config = PeftLoraConfig(rank, rank, False, (), (), frozenset(modules), None)
    return LoadedAdapter(rank, weights, config)


def expected_delta(adapter: LoadedAdapter | None, layer: int, subs: tuple[str, ...], x):  # type: ignore[no-untyped-def]
    parts = []
    for module in subs:
        width = DIMS.in_out(module)[1]
        w = None if adapter is None else adapter.modules.get((layer, module))
        parts.append(torch.zeros(x.shape[0], width) if w is None else x @ w.lora_a.T @ w.lora_b.T)
    return torch.cat(parts, dim=1)


@pytest.mark.parametrize("split_forms", [False, True])
def test_fused_wrapper_adds_each_tokens_own_delta(split_forms: bool):
    torch.manual_seed(0)
    layers = [Layer(), Layer()]
    bases = [(l.attn.qkv, l.mlp.down) for l in layers]  # noqa: E741
    lora = LoRALayers(layers, LAYOUT, DIMS, max_loras=3, max_rank=MAX_RANK)
    adapters = {
        0: adapter(1, 8, {"q_proj": 8, "k_proj": 4, "v_proj": 8, "down_proj": 2}),
        1: adapter(2, 4, {"q_proj": 4, "v_proj": 4}),  # no k, no down
        2: adapter(3, 2, {"down_proj": 2}),
    }
    for slot, a in adapters.items():
        lora.set_slot(slot, a)
    # 3 decodes (slots 1, -1, 0), then prefill chunks of 4 (slot 2) and 3 (slot 0) tokens
    seq_slots, seq_tokens = [1, NO_SLOT, 0, 2, 0], [1, 1, 1, 4, 3]
    batch = build_lora_batch(
        seq_slots, seq_tokens, num_decodes=3, slot_ranks=[8, 4, 2], max_rank=MAX_RANK,
        max_fused=3, device=torch.device("cpu"), split_forms=split_forms,
    )  # fmt: skip
    assert batch is not None
    rows = [(p.rows.start, p.rows.stop) for p in batch.parts]
    # split: decode rows, prefill rows; else one part over every row
    assert rows == ([(0, 3), (3, 10)] if split_forms else [(0, 10)])
    token_slots = [s for s, n in zip(seq_slots, seq_tokens, strict=True) for _ in range(n)]
    x = torch.randn(len(token_slots), 32)
    h = torch.randn(len(token_slots), 48)
    lora.context.batch = batch
    with torch.no_grad():
        for layer_index, layer in enumerate(layers):
            qkv_base, down_base = bases[layer_index]
            got_qkv, got_down = layer.attn.qkv(x), layer.mlp.down(h)
            for t, slot in enumerate(token_slots):
                a = adapters.get(slot)
                want_qkv = qkv_base(x[t : t + 1]) + expected_delta(
                    a, layer_index, LAYOUT["attn.qkv"], x[t : t + 1]
                )
                want_down = down_base(h[t : t + 1]) + expected_delta(
                    a, layer_index, ("down_proj",), h[t : t + 1]
                )
                torch.testing.assert_close(got_qkv[t : t + 1], want_qkv, rtol=1e-5, atol=1e-5)
                torch.testing.assert_close(got_down[t : t + 1], want_down, rtol=1e-5, atol=1e-5)
    # Clearing a slot leaves the base layer alone for its tokens.
    lora.set_slot(0, None)
    lora.context.batch = build_lora_batch(
        [0], [2], num_decodes=0, slot_ranks=[0, 4, 2], max_rank=MAX_RANK, max_fused=3,
        device=torch.device("cpu"),
    )  # fmt: skip
    with torch.no_grad():
        torch.testing.assert_close(layers[0].attn.qkv(x[:2]), bases[0][0](x[:2]))


def test_a_slot_written_again_holds_exactly_the_new_adapter():
    # Slot 1 holds a rank-8 adapter, then a rank-4 one of other modules: every value the first
    # wrote and the second does not is zero again, as in a pool that only ever held the second.
    first = adapter(1, 8, {"q_proj": 8, "k_proj": 4, "v_proj": 8, "down_proj": 2})
    second = adapter(2, 4, {"k_proj": 4, "down_proj": 3})
    reused = LoRALayers([Layer(), Layer()], LAYOUT, DIMS, max_loras=2, max_rank=MAX_RANK)
    fresh = LoRALayers([Layer(), Layer()], LAYOUT, DIMS, max_loras=2, max_rank=MAX_RANK)
    reused.set_slot(1, first)
    reused.set_slot(0, first)
    reused.set_slot(1, second)
    fresh.set_slot(0, first)
    fresh.set_slot(1, second)
    for (_, a), (_, b) in zip(reused.wrappers, fresh.wrappers, strict=True):
        assert torch.equal(a.lora_a, b.lora_a) and torch.equal(a.lora_b, b.lora_b)
        assert a.targets == b.targets
    reused.set_slot(1, None)
    for _, wrapper in reused.wrappers:
        assert not wrapper.lora_a[1].any() and not wrapper.lora_b[1].any()
        assert wrapper.targets[1] is False


def test_batch_without_adapters_runs_no_lora_op(monkeypatch: pytest.MonkeyPatch):
    assert build_lora_batch(
        [NO_SLOT, NO_SLOT], [1, 5], num_decodes=1, slot_ranks=[8], max_rank=8, max_fused=3,
        device=torch.device("cpu"),
    ) is None  # fmt: skip
    layers = [Layer()]
    lora = LoRALayers(layers, LAYOUT, DIMS, max_loras=1, max_rank=MAX_RANK)
    lora.set_slot(0, adapter(1, 8, {"q_proj": 8}))

    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("a LoRA op ran")

    monkeypatch.setattr("lora.layers.lora_add", forbidden)
    with torch.no_grad():
        layers[0].attn.qkv(torch.randn(3, 32))  # context.batch is None
        # An adapter that does not target down_proj launches nothing there either.
        lora.context.batch = build_lora_batch(
            [0], [3], num_decodes=0, slot_ranks=[8], max_rank=8, max_fused=3,
            device=torch.device("cpu"),
        )  # fmt: skip
        layers[0].mlp.down(torch.randn(3, 48))


def test_cpu_stacks_start_zeroed_and_large_ones_on_huge_page_boundaries():
    # A pool past 2 MiB a stack is mapped for huge pages (kernels/cpu/huge_pages.py, tested there):
    # 2 MiB-aligned, which torch's allocator does not give. Small stacks are plain tensors.
    big = LoRALayers([Layer()], LAYOUT, DIMS, max_loras=2048, max_rank=MAX_RANK)
    small = LoRALayers([Layer()], LAYOUT, DIMS, max_loras=2, max_rank=MAX_RANK)
    for layers, aligned in ((big, True), (small, False)):
        for _, wrapper in layers.wrappers:
            stacks = (wrapper.lora_a, wrapper.lora_b)
            assert all(not t.any() for t in stacks)
            assert wrapper.lora_a.is_contiguous() and wrapper.lora_b.transpose(1, 2).is_contiguous()
            if aligned:
                assert all(t.data_ptr() % huge_pages.HUGE_PAGE == 0 for t in stacks)
    big.set_slot(2047, adapter(3, 8, {"q_proj": 8, "down_proj": 4}))  # the last slot is usable
    assert any(w.lora_a[2047].any() for _, w in big.wrappers)


def test_wrapping_checks_the_layout():
    with pytest.raises(ValueError, match="fused widths"):
        LoRALayers([Layer()], {"attn.qkv": ("q_proj", "k_proj")}, DIMS, max_loras=1, max_rank=4)
    with pytest.raises(ValueError, match="exceeds max_lora_rank"):
        LoRALayers([Layer()], LAYOUT, DIMS, max_loras=1, max_rank=4).set_slot(
            0, adapter(1, 8, {"q_proj": 8})
        )


def test_cpu_batch_is_one_part_whose_segments_are_runs_of_one_adapter():
    batch = build_lora_batch(
        [0, 0, NO_SLOT, 1, 1, 0], [2, 3, 1, 1, 1, 4], num_decodes=0, slot_ranks=[4, 4],
        max_rank=4, max_fused=2, device=torch.device("cpu"),
    )  # fmt: skip
    assert batch is not None
    assert [(p.rows.start, p.rows.stop) for p in batch.parts] == [(0, 12)]
    single, double = batch.parts[0].metas
    # base-model rows (5) fall in no segment; consecutive sequences of one adapter merge
    assert single.segments == double.segments == ((0, 5, 0), (6, 8, 1), (8, 12, 0))
    assert (single.ranks, single.max_rank) == ((4, 4), 4)
    assert (double.ranks, double.max_rank) == ((8, 8), 8)
    assert double.slot_ranks.tolist() == [8, 8]


def test_cpu_warm_up_builds_the_short_run_kernel_and_the_wrappers_use_it():
    layers = [Layer(), Layer()]
    lora = LoRALayers(layers, LAYOUT, DIMS, max_loras=3, max_rank=MAX_RANK)
    assert lora.context.cpu_gathered is None  # before warm-up: kernels' default
    assert lora.warm_up_cpu() == "native"
    assert lora.context.cpu_gathered is native_rows()
    calls: list[int] = []

    def counting(*args: object) -> None:
        calls.append(1)
        gathered_rows(*args)  # type: ignore[arg-type]

    lora.context.cpu_gathered = counting
    lora.set_slot(0, adapter(1, 8, {"q_proj": 8, "down_proj": 4}))
    lora.set_slot(2, adapter(2, 4, {"v_proj": 4, "down_proj": 4}))
    # decode rows of two adapters and the base: one gathered call per wrapper
    lora.context.batch = build_lora_batch(
        [0, 2, NO_SLOT, 0], [1, 1, 1, 1], num_decodes=4, slot_ranks=[8, 0, 4], max_rank=8,
        max_fused=3, device=torch.device("cpu"),
    )  # fmt: skip
    with torch.no_grad():
        layers[1].attn.qkv(torch.randn(4, 32))
        layers[1].mlp.down(torch.randn(4, 48))
    assert len(calls) == 2


def test_cpu_warm_up_compiles_with_inductor_where_the_cxx_build_fails(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
):
    def no_build() -> None:
        raise NativeBuildError("no C++ compiler (set CXX, or install g++)")

    monkeypatch.setattr("lora.layers.native_rows", no_build)
    lora = LoRALayers([Layer()], LAYOUT, DIMS, max_loras=2, max_rank=MAX_RANK)
    assert lora.warm_up_cpu() == "compiled"
    assert lora.context.cpu_gathered is compiled_gathered_rows()
    assert "no C++ compiler" in caplog.text


def test_cpu_warm_up_falls_back_to_eager_where_compiling_fails(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
):
    def no_build() -> None:
        raise NativeBuildError("no C++ compiler (set CXX, or install g++)")

    def no_compiler(*args: object) -> None:
        raise RuntimeError("InvalidCxxCompiler: no working C++ compiler found")

    monkeypatch.setattr("lora.layers.native_rows", no_build)
    monkeypatch.setattr("lora.layers.compiled_gathered_rows", lambda: no_compiler)
    lora = LoRALayers([Layer()], LAYOUT, DIMS, max_loras=2, max_rank=MAX_RANK)
    assert lora.warm_up_cpu() == "eager"
    assert lora.context.cpu_gathered is gathered_rows
    assert "InvalidCxxCompiler" in caplog.text
