"""The CPU LoRA path (`kernels.cpu.reference.lora_add_cpu`, behind `kernels.triton.ops.lora_add`): a
matmul pair per long run of one slot, one gathered kernel call for the rows of the short runs
(kernels/cpu/plan.py, kernels/cpu/gathered.py; compiled by default, eager as the fallback),
products in the inputs' dtype.

Tolerances (abs and rel): float32 against the float64 per-token oracle 1e-5 (same products,
another summation order); bfloat16 against the float32 reference 3e-2: the shrink output is
rounded to bfloat16 (~4e-3 relative) before the expand, and the sum once more at the end.
The stacks are zero beyond each slot's rank (the path's precondition, which lora/layers.py
keeps), except where a test shows that a path never reads the padding.
"""

from __future__ import annotations

import pytest
import torch

from kernels.cpu.gathered import gathered_rows
from kernels.cpu.plan import DENSE_RUN_MAX, plan_cpu
from kernels.cpu.reference import lora_add_cpu, lora_expand_ref, lora_shrink_ref
from kernels.triton.meta import LoRAKernelMeta
from kernels.triton.ops import lora_add
from tests.kernels.lora_cases import (
    FORMS,
    MIXES,
    OUT_FEATURES,
    assert_untouched,
    fused_output,
    make_case,
    oracle,
    out_slice,
)


@pytest.mark.parametrize("num_tokens", [1, 7, 33, 80])
@pytest.mark.parametrize("kind", MIXES)
def test_float32_matches_the_oracle_and_touches_only_its_rows(kind: str, num_tokens: int) -> None:
    meta, x, lora_a, lora_b = make_case(kind, num_tokens, torch.float32, padding=0.0)
    fused = fused_output(num_tokens, torch.float32)
    before = fused.clone()
    lora_add_cpu(x, lora_a, lora_b, meta, out_slice(fused))  # a row-strided column slice
    delta = out_slice(fused).double() - out_slice(before).double()
    torch.testing.assert_close(delta, oracle(x, lora_a, lora_b, meta), atol=1e-5, rtol=1e-5)
    assert_untouched(before, fused, meta)


@pytest.mark.parametrize("kind", MIXES)
def test_bfloat16_stays_within_rounding_of_the_float32_reference(kind: str) -> None:
    meta, x, lora_a, lora_b = make_case(kind, 33, torch.bfloat16, padding=0.0)
    want = fused_output(33, torch.float32)
    lora_expand_ref(lora_shrink_ref(x, lora_a, meta), lora_b, meta, out_slice(want))
    got = fused_output(33, torch.bfloat16)
    before = got.clone()
    lora_add_cpu(x, lora_a, lora_b, meta, out_slice(got))
    torch.testing.assert_close(got.float(), want, atol=3e-2, rtol=3e-2)
    assert_untouched(before, got, meta)
    assert not torch.equal(got, before)  # the delta was added


def test_transposed_b_storage_gives_the_same_result() -> None:
    # lora/layers.py stores B as [slots, rank, out] on CPU and passes a transposed view
    meta, x, lora_a, lora_b = make_case("zipf", 40, torch.float32, padding=0.0)
    assert meta.cpu is not None and meta.cpu.gathered is not None  # the gathered kernel runs
    stored = lora_b.transpose(1, 2).contiguous()  # [S, R, out]
    want, got = torch.zeros(40, OUT_FEATURES), torch.zeros(40, OUT_FEATURES)
    lora_add_cpu(x, lora_a, lora_b, meta, want)
    lora_add_cpu(x, lora_a, stored.transpose(1, 2), meta, got)
    # the stored layout runs the C kernel (kernels/cpu/rows.py), the other one inductor's:
    # the same products, summed in another order
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_long_runs_never_read_the_padding() -> None:
    meta, x, lora_a, lora_b = make_case("prefill_runs", 60, torch.float32)  # NaN padding
    long_runs = [(a, b, s) for a, b, s in meta.segments if b - a > DENSE_RUN_MAX]
    long_meta = LoRAKernelMeta.build(
        [s for a, b, s in long_runs for _ in range(b - a)] or [0] * (DENSE_RUN_MAX + 1),
        list(meta.ranks),
        meta.max_rank,
        "cpu",
    )
    assert long_meta.cpu is not None and long_meta.cpu.gathered is None
    num_tokens = long_meta.num_tokens
    x = torch.randn(num_tokens, x.shape[1])
    out = torch.zeros(num_tokens, OUT_FEATURES)
    lora_add_cpu(x, lora_a, lora_b, long_meta, out)
    torch.testing.assert_close(
        out.double(), oracle(x, lora_a, lora_b, long_meta), atol=1e-5, rtol=1e-5
    )


def test_plan_gathers_every_short_run_and_keeps_long_ones_apart() -> None:
    n = DENSE_RUN_MAX
    # decode-like short runs of slots 2, 0, base, 1; a long prefill run of slot 3; a short run
    # of slot 0; base rows; two short runs, one of them on the empty slot 4
    slots = [2, 2, 0, -1, 1] + [3] * (n + 1) + [0] * 3 + [-1] * (n + 4) + [1, 4]
    segments = LoRAKernelMeta.build(slots, [4] * 4 + [0], 4, "cpu").segments
    plan = plan_cpu(segments, [4] * 4 + [0], torch.device("cpu"))
    assert plan.runs == ((5, 6 + n, 3),)
    assert plan.gathered is not None
    tail = 13 + 2 * n  # the row of the last slot-1 token
    assert plan.gathered.rows.tolist() == [0, 1, 2, 4, 6 + n, 7 + n, 8 + n, tail]
    assert plan.gathered.slots.tolist() == [2, 2, 0, 1, 0, 0, 0, 1]
    # one short run alone is just a run; rows of an empty slot get nothing at all
    alone = plan_cpu([(0, 3, 1), (3, 5, 4)], [4] * 4 + [0], torch.device("cpu"))
    assert alone.runs == ((0, 3, 1),) and alone.gathered is None


def test_tokens_on_an_empty_slot_and_the_base_model_are_untouched() -> None:
    meta = LoRAKernelMeta.build([0, 1, -1, 0], [4, 0], 4, "cpu")  # slot 1 holds no adapter
    x = torch.randn(4, 6)  # [T, in]
    lora_a, lora_b = torch.zeros(2, 4, 6), torch.zeros(2, 5, 4)  # [S, R, in], [S, out, R]
    lora_a[0], lora_b[0] = torch.randn(4, 6), torch.randn(5, 4)
    out = torch.zeros(4, 5)
    lora_add_cpu(x, lora_a, lora_b, meta, out)
    assert torch.equal(out[1:3], torch.zeros(2, 5))
    for t in (0, 3):
        torch.testing.assert_close(out[t], x[t] @ lora_a[0].T @ lora_b[0].T)


def test_ops_lora_add_on_cpu_runs_the_grouped_path() -> None:
    meta, x, lora_a, lora_b = make_case("with_base", 9, torch.float32, padding=0.0)
    want = torch.zeros(9, OUT_FEATURES)
    lora_add_cpu(x, lora_a, lora_b, meta, want)
    for form in FORMS:
        out = torch.zeros(9, OUT_FEATURES)
        lora_add(x, lora_a, lora_b, meta, out, form=form)
        assert torch.equal(out, want)
    with pytest.raises(ValueError, match="form"):
        lora_add(x, lora_a, lora_b, meta, want, form="bgmv")  # type: ignore[arg-type]


def test_a_hostile_slot_in_a_gathered_call_cannot_reach_other_tokens() -> None:
    # Slot 1 holds the largest weights the loader accepts (the float16 range): in float16 its
    # tokens overflow to inf. Tokens of slot 0 and of the base model must come out exactly as if
    # slot 1 were empty.
    meta = LoRAKernelMeta.build([0, 1, -1, 0, 1], [4, 4], 4, "cpu")
    assert meta.cpu is not None and meta.cpu.gathered is not None
    x = torch.randn(5, 8).half()  # [T, in]
    lora_a = torch.zeros(2, 4, 8).half()  # [S, R, in]
    lora_b = torch.zeros(2, 6, 4).half()  # [S, out, R]
    lora_a[0], lora_b[0] = torch.randn(4, 8).half(), torch.randn(6, 4).half()
    clean = torch.zeros(5, 6).half()
    lora_add_cpu(x, lora_a, lora_b, meta, clean)
    lora_a[1], lora_b[1] = 65504.0, 65504.0
    out = torch.zeros(5, 6).half()
    lora_add_cpu(x, lora_a, lora_b, meta, out)
    for t in (0, 2, 3):
        assert torch.equal(out[t], clean[t])
    assert not torch.isfinite(out[1]).all()  # the hostile adapter only breaks its own tokens


def test_the_gathered_kernel_reads_only_the_slots_its_rows_use() -> None:
    # decode rows on slots 0, 7 and 31; every other slot of the range holds NaN weights (and
    # a rank), as a slot loaded with another adapter would: a read of one shows in the output
    slots = [0, 0, 7, 31, 31, 0]
    ranks = [4] * 32
    meta = LoRAKernelMeta.build(slots, ranks, 4, "cpu")
    assert meta.cpu is not None and meta.cpu.gathered is not None and meta.cpu.runs == ()
    gen = torch.Generator().manual_seed(7)
    lora_a = torch.full((32, 4, 6), float("nan"))  # [S, R, in]
    lora_b = torch.full((32, 5, 4), float("nan"))  # [S, out, R]
    for slot in (0, 7, 31):
        lora_a[slot] = torch.randn(4, 6, generator=gen)
        lora_b[slot] = torch.randn(5, 4, generator=gen)
    x = torch.randn(6, 6, generator=gen)
    out = torch.zeros(6, 5)
    lora_add_cpu(x, lora_a, lora_b, meta, out)
    torch.testing.assert_close(out.double(), oracle(x, lora_a, lora_b, meta), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", ["all_distinct", "zipf", "with_base"])
def test_compiled_kernel_matches_it_run_eager(kind: str, dtype: torch.dtype) -> None:
    # NaN beyond every slot's rank: neither version may read it
    meta, x, lora_a, lora_b = make_case(kind, 40, dtype)
    assert meta.cpu is not None and meta.cpu.gathered is not None
    eager, compiled = fused_output(40, dtype), fused_output(40, dtype)
    lora_add_cpu(x, lora_a, lora_b, meta, out_slice(eager), cpu_gathered=gathered_rows)
    lora_add_cpu(x, lora_a, lora_b, meta, out_slice(compiled))  # the default: compiled
    assert torch.isfinite(compiled).all()
    # float32: summation order; bfloat16: each may round y and the sum one ulp the other way
    tol = 1e-5 if dtype == torch.float32 else 6e-2
    torch.testing.assert_close(compiled.float(), eager.float(), atol=tol, rtol=tol)


def _fused_case(
    slots: list[int], ranks: list[int], off_block: float
) -> tuple[LoRAKernelMeta, torch.Tensor, torch.Tensor, torch.Tensor, list[tuple[int, int]]]:
    """Stacks fusing 3 sub-projections the way lora/layers.py does: a slot of adapter rank r
    holds sub i's A rows and B columns at [i * r, i * r + r), sub i's outputs at its columns;
    `off_block` fills B outside those blocks (zero in the engine)."""
    gen = torch.Generator().manual_seed(len(slots))
    widths, max_rank, in_features = (5, 3, 3), 4, 6
    subs = [(0, 5), (5, 3), (8, 3)]
    num_slots = len(ranks)
    lora_a = torch.zeros(num_slots, 3 * max_rank, in_features)  # [S, 3R, in]
    lora_b = torch.full((num_slots, sum(widths), 3 * max_rank), off_block)  # [S, out, 3R]
    for slot, r in enumerate(ranks):
        lora_b[slot, :, 3 * r :] = 0.0  # beyond the slot's (fused) rank: zero, as layers.py
        for i, (offset, width) in enumerate(subs):
            lora_a[slot, i * r : i * r + r] = torch.randn(r, in_features, generator=gen)
            block = torch.randn(width, r, generator=gen)
            lora_b[slot, offset : offset + width, i * r : i * r + r] = block
    meta = LoRAKernelMeta.build(slots, [3 * r for r in ranks], 3 * max_rank, "cpu")
    x = torch.randn(len(slots), in_features, generator=gen)
    return meta, x, lora_a, lora_b, subs


@pytest.mark.parametrize("ranks", [[4, 4, 4], [4, 2, 4]], ids=["one-rank", "mixed-ranks"])
def test_fused_stacks_skip_their_zero_blocks(ranks: list[int]) -> None:
    n = DENSE_RUN_MAX
    # decode-like short runs (the gathered kernel), then a long run and a base row
    slots = [0, 0, 1, 2, 2] + [1] * (n + 3) + [-1]
    meta, x, lora_a, lora_b, subs = _fused_case(slots, ranks, off_block=0.0)
    assert meta.cpu is not None and meta.cpu.gathered is not None and meta.cpu.runs
    want = torch.zeros(len(slots), 11)
    lora_add_cpu(x, lora_a, lora_b, meta, want)  # block-diagonal B multiplied whole
    torch.testing.assert_close(want.double(), oracle(x, lora_a, lora_b, meta), atol=1e-5, rtol=1e-5)
    got = torch.zeros(len(slots), 11)
    lora_add_cpu(x, lora_a, lora_b, meta, got, subs)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    # NaN outside the diagonal blocks shows which products were computed: told the sub-
    # projections, neither path reads them; told nothing, the fused B is multiplied whole
    _, _, _, poisoned, _ = _fused_case(slots, ranks, off_block=float("nan"))
    out = torch.zeros(len(slots), 11)
    lora_add_cpu(x, lora_a, poisoned, meta, out, subs)
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)
    whole = torch.zeros(len(slots), 11)
    lora_add_cpu(x, lora_a, poisoned, meta, whole)
    assert not torch.isfinite(whole[:-1]).any()
