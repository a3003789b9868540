"""The fused layer kernels (kernels/cpu/native/layer.cpp through kernels/cpu/layer.py) against the
PyTorch operators they replace (engine/models/layer_ops.py's reference path).

RoPE with the cache write, the residual add and SiLU-times-up round exactly where the operators
do, so bfloat16 results are equal bit for bit; in float32 the norm's 1/sqrt and SiLU's exp are
libm-accurate where PyTorch's vectorised ones differ in the last bit, so float32 agrees to a few
ulps. Row counts straddle the kernels' threading thresholds (8 rows, 64 Ki elements)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.models.hf_config import RopeConfig
from engine.models.layer_ops import LayerOps, RotaryInputs, rms_norm_reference
from engine.models.rope import RotaryEmbedding, apply_rotary
from kernels.cpu.layer import native_layer

DTYPES = [torch.bfloat16, torch.float32]
ROWS = [1, 7, 9, 64]


def _close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> None:
    if dtype == torch.bfloat16:
        assert torch.equal(got, want), (got.float() - want.float()).abs().max()
    else:
        torch.testing.assert_close(got, want, rtol=4e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", ROWS)
def test_add_rms_norm_matches_the_operators(dtype: torch.dtype, rows: int) -> None:
    gen = torch.Generator().manual_seed(rows)
    # x a column slice of a wider output (a row stride beyond its width), as projections hand it
    wide = torch.randn(rows, 800, generator=gen).to(dtype)
    x = wide[:, 16:784]
    residual = torch.randn(rows, 768, generator=gen).to(dtype)
    weight = (torch.rand(768, generator=gen) + 0.5).to(dtype)
    want_sum = residual + x

    updated = residual.clone()
    got = native_layer().add_rms_norm(x, updated, weight, 1e-6)
    assert torch.equal(updated, want_sum)  # the residual stream, exactly
    _norm_close(got, rms_norm_reference(want_sum, weight, 1e-6), dtype)
    alone = native_layer().add_rms_norm(x, None, weight, 1e-6)
    _norm_close(alone, rms_norm_reference(x, weight, 1e-6), dtype)


def test_add_rms_norm_sixteen_at_a_time_equals_the_scalar_loop() -> None:
    """bf16 rows of 40: values 0-31 go through the AVX-512 form (where the CPU has it), 32-39
    through the scalar loop. The same inputs at 0-7 and 32-39 (a row shares one normaliser)
    give the same bits, in the residual stream and in the output."""
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(3, 40, generator=gen) * 4
    residual = torch.randn(3, 40, generator=gen) * 4
    weight = torch.rand(40, generator=gen) + 0.5
    for t in (x, residual):
        t[:, 32:] = t[:, :8]
    weight[32:] = weight[:8]
    x, residual, weight = x.bfloat16(), residual.bfloat16(), weight.bfloat16()
    out = native_layer().add_rms_norm(x, residual, weight, 1e-6)
    for t in (residual, out):
        bits = t.view(torch.int16)
        assert torch.equal(bits[:, :8], bits[:, 32:])


def _norm_close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> None:
    """The norm's 1/sqrt is libm's, PyTorch's a vectorised one: in bfloat16 a value on a rounding
    boundary may round the other way (one ulp, two after the weight), in a few elements at most."""
    if dtype == torch.float32:
        _close(got, want, dtype)
        return
    assert (got != want).float().mean() < 0.01
    torch.testing.assert_close(got, want, rtol=1.6e-2, atol=0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", ROWS)
def test_silu_mul_matches_the_operators(dtype: torch.dtype, rows: int) -> None:
    gen = torch.Generator().manual_seed(rows)
    # large gates both ways: the sigmoid's two branches and exp's underflow
    gate_up = (torch.randn(rows, 2 * 2048, generator=gen) * 8).to(dtype)
    gate_up[0, :4] = torch.tensor([-100.0, 100.0, 0.0, -0.0])
    gate, up = gate_up.split(2048, dim=-1)
    _close(native_layer().silu_mul(gate_up), F.silu(gate) * up, dtype)


def test_silu_mul_sixteen_at_a_time_equals_the_scalar_loop() -> None:
    """bf16 rows of 24: the first 16 go through the AVX-512 form (where the CPU has it), the
    last 8 through the scalar loop. The same gates and ups in both places, special values
    included, come out as the same bits."""
    specials = [float("nan"), float("inf"), -float("inf"), -100.0, -87.5, 1e-39, -1e-39, 3e38]
    gen = torch.Generator().manual_seed(3)
    gate = torch.randn(3, 24, generator=gen) * 8
    up = torch.randn(3, 24, generator=gen) * 8
    gate[0, :8], up[0, :8] = torch.tensor(specials), torch.tensor(specials[::-1])
    gate[:, 16:], up[:, 16:] = gate[:, :8], up[:, :8]
    out = native_layer().silu_mul(torch.cat([gate, up], dim=1).bfloat16()).view(torch.int16)
    assert torch.equal(out[:, :8], out[:, 16:])
    gate, up = gate[:, 8:16].bfloat16(), up[:, 8:16].bfloat16()
    _close(out[:, 8:16].view(torch.bfloat16), F.silu(gate) * up, torch.bfloat16)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("tokens", "head_dim"), [(1, 64), (9, 64), (33, 64), (9, 40), (9, 128)])
def test_rope_and_cache_write_match_the_operators(
    dtype: torch.dtype, tokens: int, head_dim: int
) -> None:
    """head_dim 40: half a head is 16 values by AVX-512 (where the CPU has it) and 4 by the
    scalar loop; 64 and 128 all by the former."""
    gen = torch.Generator().manual_seed(tokens)
    heads, kv_heads, num_slots = 6, 2, 80
    rope = RopeConfig(theta=500000.0, rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                      high_freq_factor=4.0, original_max_position_embeddings=256)  # fmt: skip
    table = RotaryEmbedding(rope, head_dim, 1024, torch.device("cpu"))
    positions = torch.randint(0, 1024, (tokens,), generator=gen)
    slots = torch.randperm(num_slots, generator=gen)[:tokens]
    # q, k, v as the model hands them: views into one fused projection output
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, generator=gen).to(dtype)
    q, k, v = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    q, k, v = (t.view(tokens, -1, head_dim) for t in (q, k, v))
    caches = [torch.full((kv_heads, num_slots, head_dim), 7.0, dtype=dtype) for _ in range(4)]

    want_q, want_k = apply_rotary(q, k, table.lookup(positions, dtype))
    caches[0].index_copy_(1, slots, want_k.transpose(0, 1))
    caches[1].index_copy_(1, slots, v.transpose(0, 1))
    got_q, got_k = q.clone(), k.clone()
    native_layer().rope_kv(got_q, got_k, v, table.cos, table.sin, positions, caches[2],
                           caches[3], slots)  # fmt: skip
    assert torch.equal(got_q, want_q)
    assert torch.equal(got_k, want_k)
    assert torch.equal(caches[2], caches[0])  # written slots equal, every other slot untouched
    assert torch.equal(caches[3], caches[1])


def test_rope_refuses_slots_and_positions_out_of_range() -> None:
    table = RotaryEmbedding(RopeConfig(theta=10000.0), 64, 16, torch.device("cpu"))
    qkv = torch.randn(2, 3 * 64)
    q, k, v = (t.view(2, 1, 64) for t in qkv.split(64, dim=-1))
    cache = torch.zeros(1, 8, 64)
    for positions, slots in (([0, 16], [0, 1]), ([0, 1], [0, 8]), ([0, 1], [-1, 2])):
        with pytest.raises(IndexError, match="out of range"):
            native_layer().rope_kv(q, k, v, table.cos, table.sin, torch.tensor(positions),
                                   cache, cache.clone(), torch.tensor(slots))  # fmt: skip


def test_layer_ops_fall_back_where_the_kernels_do_not_apply() -> None:
    """float16 (no kernel), 3-D norms (Qwen3's per-head q/k norm): the operators run."""
    ops = LayerOps(native_layer())
    x = torch.randn(4, 3, 64, dtype=torch.float16)
    weight = torch.ones(64, dtype=torch.float16)
    assert torch.equal(ops.rms_norm(x, weight, 1e-6), rms_norm_reference(x, weight, 1e-6))
    x32 = torch.randn(4, 3, 64)
    assert torch.equal(ops.rms_norm(x32, weight.float(), 1e-6),
                       rms_norm_reference(x32, weight.float(), 1e-6))  # fmt: skip
    gate_up = torch.randn(4, 128, dtype=torch.float16)
    assert torch.equal(ops.silu_mul(gate_up, 64), F.silu(gate_up[:, :64]) * gate_up[:, 64:])
    table = RotaryEmbedding(RopeConfig(theta=10000.0), 64, 16, torch.device("cpu"))
    rotary = RotaryInputs(table, torch.tensor([3, 4]), torch.float16)
    qkv = torch.randn(2, 3 * 64, dtype=torch.float16)
    q, k, v = (t.view(2, 1, 64) for t in qkv.split(64, dim=-1))
    cache = (torch.zeros(1, 8, 64, dtype=torch.float16), torch.zeros(1, 8, 64, dtype=torch.float16))
    got_q, got_k = ops.rope_and_cache(q, k, v, rotary, cache, torch.tensor([5, 6]))
    want_q, want_k = apply_rotary(q, k, rotary.cos_sin())
    assert torch.equal(got_q, want_q) and torch.equal(got_k, want_k)
    assert torch.equal(cache[0][:, 5:7], want_k.transpose(0, 1))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("query_len", "offset"), [(1, 0), (9, 0), (7, 5), (300, 0)])
def test_causal_softmax_matches_the_operators(
    dtype: torch.dtype, query_len: int, offset: int
) -> None:
    # what decode_matmul's operators do to scores, with the causal mask of a prefill chunk
    gen = torch.Generator().manual_seed(query_len)
    heads, keys = 3, offset + query_len
    scores = (torch.randn(heads * query_len, keys, generator=gen) * 4).to(dtype)
    query = torch.arange(heads * query_len) % query_len
    hidden = torch.arange(keys)[None, :] > (offset + query)[:, None]
    want = scores.float().mul(0.125).masked_fill(hidden, float("-inf")).softmax(-1).to(dtype)
    got = scores.clone()
    native_layer().causal_softmax(got, query_len=query_len, offset=offset, scale=0.125)
    assert torch.equal(got[hidden], torch.zeros_like(got[hidden]))  # nothing seen ahead
    # the exp is a polynomial, PyTorch's its own: an ulp apart at most
    tol = {"atol": 8e-3, "rtol": 8e-3} if dtype == torch.bfloat16 else {"atol": 1e-6, "rtol": 1e-5}
    torch.testing.assert_close(got, want, **tol)


def test_causal_softmax_refuses_a_chunk_that_sees_past_its_keys() -> None:
    scores = torch.zeros(8, 5)
    with pytest.raises(ValueError, match="past the keys"):
        native_layer().causal_softmax(scores, query_len=4, offset=2, scale=1.0)
    with pytest.raises(ValueError, match="contiguous"):
        native_layer().causal_softmax(scores[:, :4], query_len=4, offset=0, scale=1.0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows, cols", [(1, 7), (3, 1000), (64, 16384), (5, 33)])
def test_argmax_picks_as_torch_does(dtype: torch.dtype, rows: int, cols: int) -> None:
    gen = torch.Generator().manual_seed(rows * cols)
    x = torch.randn(rows, cols, generator=gen).to(dtype)
    if rows > 2 and cols > 20:
        x[0, 3] = x[0, 17] = 40.0  # equal maxima: the first
        x[1, 5] = x[1, 9] = float("nan")  # a NaN wins over any number, the first NaN
        x[1, 2] = float("inf")
        x[2] = float("-inf")  # nothing larger than the first
    assert torch.equal(native_layer().argmax(x), x.argmax(dim=-1))
    wide = torch.zeros(rows, cols + 9, dtype=dtype)
    wide[:, :cols] = x
    wide[:, cols:] = 1e4  # past the row's end: never read
    assert torch.equal(native_layer().argmax(wide[:, :cols]), x.argmax(dim=-1))


def test_argmax_refuses_what_it_cannot_read() -> None:
    with pytest.raises(ValueError, match="argmax needs"):
        native_layer().argmax(torch.randn(4, 8).t())
    with pytest.raises(ValueError, match="argmax needs"):
        native_layer().argmax(torch.randn(4, 8, dtype=torch.float64))
