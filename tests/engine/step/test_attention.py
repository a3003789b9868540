"""Paged attention (engine/step/attention.py) against a naive float64 attention over each sequence's
own keys, for every decode backend, and the start-up choice between them."""

from __future__ import annotations

import math
import random
import time

import pytest
import torch

from engine.config import EngineConfig
from engine.step import prefill_backend
from engine.step.attention import AttentionMetadata, PrefillSegment, paged_attention, prefill_matmul
from engine.step.decode_backend import choose_decode_backend
from engine.step.prefill_backend import choose_prefill_kernel, choose_prefill_softmax
from kernels.cpu.layer import native_layer
from kernels.cpu.prefill import native_prefill

HEADS, KV_HEADS, HEAD_DIM, BLOCK = 6, 2, 8, 4
NUM_BLOCKS = 64


def _naive(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, causal_from: int
) -> torch.Tensor:
    """q [n, H, D] at positions causal_from..; keys/values [ctx, KV, D]; float64 softmax."""
    group = HEADS // KV_HEADS
    k = keys.double().repeat_interleave(group, dim=1)  # [ctx, H, D]
    v = values.double().repeat_interleave(group, dim=1)
    scores = torch.einsum("nhd,chd->hnc", q.double(), k) / math.sqrt(HEAD_DIM)
    positions = torch.arange(causal_from, causal_from + q.shape[0])
    scores = scores.masked_fill(torch.arange(k.shape[0])[None, :] > positions[:, None], -math.inf)
    return torch.einsum("hnc,chd->nhd", scores.softmax(-1), v)


def _tables(lengths: list[int], rng: random.Random) -> list[list[int]]:
    free = list(range(NUM_BLOCKS))
    rng.shuffle(free)  # blocks of a sequence are scattered over the cache
    return [[free.pop() for _ in range(-(-n // BLOCK))] for n in lengths]


def _slots(table: list[int], begin: int, end: int) -> torch.Tensor:
    return torch.tensor([table[p // BLOCK] * BLOCK + p % BLOCK for p in range(begin, end)])


@pytest.mark.parametrize("backend", ["matmul", "sdpa", "native"])
def test_decode_rows_of_very_different_lengths_match_naive_attention(backend: str) -> None:
    rng, gen = random.Random(0), torch.Generator().manual_seed(0)
    lengths = [3, 17, 40, 41, 130]  # several length groups, partial last blocks
    tables = _tables(lengths, rng)
    k_cache = torch.zeros(KV_HEADS, NUM_BLOCKS * BLOCK, HEAD_DIM)
    v_cache = torch.zeros_like(k_cache)
    history = []
    for table, n in zip(tables, lengths, strict=True):  # the first n - 1 tokens are cached
        k, v = torch.randn(2, n, KV_HEADS, HEAD_DIM, generator=gen)
        slots = _slots(table, 0, n - 1)
        k_cache[:, slots], v_cache[:, slots] = k[:-1].transpose(0, 1), v[:-1].transpose(0, 1)
        history.append((k, v))
    q = torch.randn(len(lengths), HEADS, HEAD_DIM, generator=gen)
    new_k = torch.stack([k[-1] for k, _ in history])  # [rows, KV, D]: this step's tokens
    new_v = torch.stack([v[-1] for _, v in history])
    width = max(len(t) for t in tables)
    meta = AttentionMetadata(
        slot_mapping=torch.cat([_slots(t, n - 1, n) for t, n in zip(tables, lengths, strict=True)]),
        num_decodes=len(lengths),
        block_size=BLOCK,
        decode_tables=torch.tensor([t + [0] * (width - len(t)) for t in tables]),
        decode_lengths=lengths,
        prefills=[],
        decode_backend=backend,  # type: ignore[arg-type]
    )
    out = paged_attention(q, new_k, new_v, k_cache, v_cache, meta, HEAD_DIM**-0.5)
    if backend == "native":  # reads the cache in place: no groups, no gathered copies
        assert meta.decode_groups is None
    else:
        assert meta.decode_groups is not None and len(meta.decode_groups) > 1
    for row, ((k, v), n) in enumerate(zip(history, lengths, strict=True)):
        want = _naive(q[row : row + 1], k, v, causal_from=n - 1)
        torch.testing.assert_close(out[row : row + 1].double(), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("cached", [0, 9], ids=["fresh-prompt", "after-cached-context"])
@pytest.mark.parametrize("form", ["sdpa", "matmul"])
def test_prefill_chunk_matches_naive_attention(form: str, cached: int) -> None:
    rng, gen = random.Random(1), torch.Generator().manual_seed(1)
    (table,) = _tables([23], rng)
    k, v = torch.randn(2, 23, KV_HEADS, HEAD_DIM, generator=gen)
    k_cache = torch.zeros(KV_HEADS, NUM_BLOCKS * BLOCK, HEAD_DIM)
    v_cache = torch.zeros_like(k_cache)
    if cached:
        earlier = _slots(table, 0, cached)
        k_cache[:, earlier] = k[:cached].transpose(0, 1)
        v_cache[:, earlier] = v[:cached].transpose(0, 1)
    q = torch.randn(23 - cached, HEADS, HEAD_DIM, generator=gen)  # positions cached..22
    context = _slots(table, 0, 23) if cached else None
    meta = AttentionMetadata(
        slot_mapping=_slots(table, cached, 23),
        num_decodes=0,
        block_size=BLOCK,
        decode_tables=None,
        decode_lengths=[],
        prefills=[PrefillSegment(0, 23 - cached, cached, context)],
        prefill_softmax=native_layer() if form == "matmul" else None,
    )
    out = paged_attention(q, k[cached:], v[cached:], k_cache, v_cache, meta, HEAD_DIM**-0.5)
    want = _naive(q, k, v, causal_from=cached)
    torch.testing.assert_close(out.double(), want, atol=1e-5, rtol=1e-5)


def test_prefill_matmul_in_bfloat16_stays_within_rounding() -> None:
    # scores and probabilities rounded to bf16 between the ops (transformers' eager attention)
    gen = torch.Generator().manual_seed(2)
    q = torch.randn(40, HEADS, HEAD_DIM, generator=gen)
    k, v = torch.randn(2, 40, KV_HEADS, HEAD_DIM, generator=gen)
    empty = torch.empty(KV_HEADS, 0, HEAD_DIM, dtype=torch.bfloat16)
    out = prefill_matmul(
        q.bfloat16(), k.bfloat16(), v.bfloat16(), empty, empty,
        PrefillSegment(0, 40, 0, None), HEAD_DIM**-0.5, native_layer(),
    )  # fmt: skip
    want = _naive(q.bfloat16().float(), k.bfloat16().float(), v.bfloat16().float(), causal_from=0)
    torch.testing.assert_close(out.double(), want, atol=3e-2, rtol=3e-2)


@pytest.mark.skipif(
    not native_prefill().available, reason="this CPU has no AVX512-BF16: no native prefill kernel"
)
def test_the_native_prefill_kernel_reads_each_segments_keys_from_the_cache() -> None:
    """Two segments in one step, a fresh prompt and a chunk after 21 cached tokens, with every
    K/V written to the cache first (as the model does): the kernel (given the slots of the
    step's tokens or of the sequence's context) gives what the matmul form gives."""
    heads, kv_heads, head_dim, block = 12, 4, 64, 16
    rng, gen = random.Random(3), torch.Generator().manual_seed(3)
    free = list(range(32))
    rng.shuffle(free)
    tables = [[free.pop() for _ in range(2)], [free.pop() for _ in range(4)]]
    k_cache = torch.randn(kv_heads, 32 * block, head_dim, generator=gen).bfloat16()
    v_cache = torch.randn(kv_heads, 32 * block, head_dim, generator=gen).bfloat16()

    def slots(table: list[int], begin: int, end: int) -> torch.Tensor:
        return torch.tensor([table[p // block] * block + p % block for p in range(begin, end)])

    fresh, cached, chunk = 30, 21, 40  # segment 0: tokens 0..29; segment 1: tokens 21..60
    q = torch.randn(fresh + chunk, heads, head_dim, generator=gen).bfloat16()
    step_slots = torch.cat([slots(tables[0], 0, fresh), slots(tables[1], cached, cached + chunk)])
    k = k_cache[:, step_slots].transpose(0, 1)  # this step's K/V, already in the cache
    v = v_cache[:, step_slots].transpose(0, 1)
    segments = [
        PrefillSegment(0, fresh, 0, None),
        PrefillSegment(fresh, chunk, cached, slots(tables[1], 0, cached + chunk)),
    ]
    outs = {}
    for form in ("kernel", "matmul"):
        meta = AttentionMetadata(
            slot_mapping=step_slots,
            num_decodes=0,
            block_size=block,
            decode_tables=None,
            decode_lengths=[],
            prefills=segments,
            prefill_softmax=native_layer(),
            prefill_kernel=native_prefill() if form == "kernel" else None,
        )
        outs[form] = paged_attention(q, k, v, k_cache, v_cache, meta, head_dim**-0.5)
    # Within a bf16 step of the matmul form, but where the kernel's softmax (summed 16 lanes at
    # a time, softmax_bf16.h) rounds a probability the other way: then that row moves by
    # at most the probability's bf16 step times a value. Keys read from the wrong slots would
    # be off by far more, everywhere.
    diff = (outs["kernel"].float() - outs["matmul"].float()).abs()
    step = outs["matmul"].float().abs().clamp_min(2**-20) * 2**-7
    assert (diff <= step).float().mean() > 0.999
    assert diff.max() <= 2**-8 * v_cache.float().abs().max()
    assert (outs["kernel"] == outs["matmul"]).float().mean() > 0.95


def test_the_prefill_kernel_is_chosen_only_for_the_matmul_form_where_it_runs() -> None:
    cpu, native = torch.device("cpu"), native_layer()
    kernel = choose_prefill_kernel(native, head_dim=64, dtype=torch.bfloat16, device=cpu)
    assert (kernel is not None) == native_prefill().available
    kernel = choose_prefill_kernel(native, head_dim=64, dtype=torch.float32, device=cpu)
    assert (kernel is not None) == native_prefill().f32_available
    assert choose_prefill_kernel(None, head_dim=64, dtype=torch.bfloat16, device=cpu) is None
    assert choose_prefill_kernel(native, head_dim=8, dtype=torch.bfloat16, device=cpu) is None
    assert choose_prefill_kernel(native, head_dim=64, dtype=torch.float16, device=cpu) is None


def test_prefill_form_is_chosen_by_timing(monkeypatch: pytest.MonkeyPatch) -> None:
    dims = {"num_heads": HEADS, "num_kv_heads": KV_HEADS, "head_dim": HEAD_DIM}
    cpu, native = torch.device("cpu"), native_layer()
    # no native kernels, or a dtype they lack: SDPA without timing anything
    assert choose_prefill_softmax("auto", None, dtype=torch.float32, device=cpu, **dims) is None
    assert choose_prefill_softmax("auto", native, dtype=torch.float16, device=cpu, **dims) is None

    def slow(*args: object) -> object:
        time.sleep(0.1)  # far beyond either form's real time, even on a loaded machine
        return None

    # the matmul form by two matmuls (no native prefill kernel for the dtype here)
    monkeypatch.setattr(prefill_backend, "_kernel", lambda **kwargs: None)
    monkeypatch.setattr(prefill_backend, "prefill_matmul", slow)
    assert choose_prefill_softmax("auto", native, dtype=torch.float32, device=cpu, **dims) is None
    # pinned: no timing decides (the slow form is kept when asked for)
    assert (
        choose_prefill_softmax("matmul", native, dtype=torch.float32, device=cpu, **dims) is native
    )
    monkeypatch.undo()
    monkeypatch.setattr(prefill_backend, "_kernel", lambda **kwargs: None)
    monkeypatch.setattr(prefill_backend, "prefill_sdpa", slow)
    assert choose_prefill_softmax("auto", native, dtype=torch.float32, device=cpu, **dims) is native
    assert choose_prefill_softmax("sdpa", native, dtype=torch.float32, device=cpu, **dims) is None
    monkeypatch.undo()


@pytest.mark.skipif(
    not native_prefill().f32_available, reason="this CPU has no AVX2 + FMA: no float32 kernel"
)
def test_where_the_kernel_runs_it_is_the_matmul_form_that_is_timed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    dims = {"num_heads": HEADS, "num_kv_heads": KV_HEADS, "head_dim": 16}  # a size it takes
    cpu, native = torch.device("cpu"), native_layer()
    calls = []

    def slow(self: object, *args: object) -> object:
        calls.append(1)
        time.sleep(0.1)
        return None

    monkeypatch.setattr(type(native_prefill()), "__call__", slow)
    assert choose_prefill_softmax("auto", native, dtype=torch.float32, device=cpu, **dims) is None
    assert calls  # the kernel was timed (two slow matmuls were not asked for)
    monkeypatch.undo()
    monkeypatch.setattr(prefill_backend, "prefill_sdpa", lambda *args: time.sleep(0.1))
    assert choose_prefill_softmax("auto", native, dtype=torch.float32, device=cpu, **dims) is native


@pytest.mark.skipif(
    not native_prefill().f32_available, reason="this CPU has no AVX2 + FMA: no float32 kernel"
)
def test_a_near_tie_keeps_sdpa_against_two_matmuls_but_not_against_the_kernel(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The matmul form timed 1.1x faster than SDPA: as two matmuls that is within the margin
    (SDPA kept); as the native kernel, which rounds as eager attention does, it is enough."""
    dims = {"num_heads": HEADS, "num_kv_heads": KV_HEADS, "head_dim": 16}
    cpu, native = torch.device("cpu"), native_layer()
    monkeypatch.setattr(
        prefill_backend, "best_times", lambda runs, repeats: {"matmul": 1.0, "sdpa": 1.1}
    )
    assert choose_prefill_softmax("auto", native, dtype=torch.float32, device=cpu, **dims) is native
    monkeypatch.setattr(prefill_backend, "_kernel", lambda **kwargs: None)
    assert choose_prefill_softmax("auto", native, dtype=torch.float32, device=cpu, **dims) is None


def test_a_pinned_prefill_form_is_checked() -> None:
    dims = {"num_heads": HEADS, "num_kv_heads": KV_HEADS, "head_dim": HEAD_DIM}
    cpu, native = torch.device("cpu"), native_layer()
    with pytest.raises(ValueError, match="prefill_attention 'matmul' needs fused_layer_ops"):
        choose_prefill_softmax("matmul", None, dtype=torch.float32, device=cpu, **dims)
    with pytest.raises(ValueError, match="prefill_attention"):
        choose_prefill_softmax("flash", native, dtype=torch.float32, device=cpu, **dims)
    with pytest.raises(ValueError, match="prefill_attention"):
        EngineConfig(model="m", prefill_attention="flash")


def test_the_backend_choice() -> None:
    dims = {"num_heads": HEADS, "num_kv_heads": KV_HEADS, "head_dim": HEAD_DIM}
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    for name in ("matmul", "sdpa", "native"):
        assert choose_decode_backend(name, dtype=torch.float32, device=cpu, **dims) == name
    assert choose_decode_backend("auto", dtype=torch.float32, device=cuda, **dims) == "sdpa"
    # on CPU "auto" times all three on this machine: any may win, but it must be one of them
    assert choose_decode_backend("auto", dtype=torch.bfloat16, device=cpu, **dims) in (
        "matmul",
        "sdpa",
        "native",
    )
    with pytest.raises(ValueError, match="native"):  # the kernel has no fp16 entry
        choose_decode_backend("native", dtype=torch.float16, device=cpu, **dims)
    with pytest.raises(ValueError, match="decode_attention"):
        choose_decode_backend("flash", dtype=torch.float32, device=cpu, **dims)
    with pytest.raises(ValueError, match="decode_attention"):
        EngineConfig(model="m", decode_attention="flash")
