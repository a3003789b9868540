"""The tiled kernel for runs of rows that share a slot (kernels/cpu/native/lora_runs.h through
`NativeRows.run_segments`): bf16, every run of a step in one call, by AVX512-BF16 where the CPU
has it and by AVX2 FMAs (kernels/cpu/native/lora_runs_fma.h) where it has those only; the FMA tiles
are also built and checked on an AVX-512 CPU (`-mno-avx512f`). Checked against the
row-at-a-time kernel (the same function) and a float64 oracle, on shapes that reach every
tail: runs of 1-9 rows (tiles of 4 and what is left), odd ranks (a pair of B's rows with one
row missing), input widths off a multiple of 32 (16) and output widths off 16, fused
sub-projections, NaN beyond each slot's rank and in the other sub-projections' blocks of B.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from kernels.cpu.native.build import build
from kernels.cpu.rows import SOURCE, NativeRows, native_rows

pytestmark = pytest.mark.skipif(
    not native_rows().runs_bf16,
    reason="this CPU has neither AVX512-BF16 nor AVX2 + FMA: the tiled runs kernel is not built "
    "(the row kernel and BLAS run every call; tests/kernels/cpu/test_cpu_native.py covers them)",
)


@pytest.fixture(scope="module", params=["native", "fma"])
def kernel(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> NativeRows:
    """This CPU's build, and one without AVX-512 (the FMA tiles; the same as the first on an
    AVX2 CPU)."""
    if request.param == "native":
        return native_rows()
    rows = NativeRows(
        build(tmp_path_factory.mktemp("fma"), source=SOURCE, extra_flags=("-mno-avx512f",))
    )
    assert rows.runs_bf16
    return rows


def _case(
    seed: int, in_features: int, widths: tuple[int, ...], rank: int
) -> tuple[torch.Tensor, ...]:
    """x, lora_a [S, n R, in], lora_b_rows [S, n R, out] (NaN beyond each slot's rank and off
    its sub-projection's block), slot_ranks, segments [K, 3]."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    n, num_slots = len(widths), 5
    out_features = sum(widths)
    ranks = [rng.choice([1, 3, rank - 1, rank]) for _ in range(num_slots - 1)] + [0]
    lora_a = torch.full((num_slots, n * rank, in_features), float("nan"))
    b_rows = torch.full((num_slots, n * rank, out_features), float("nan"))
    for slot, r in enumerate(ranks):
        offset = 0
        for i, width in enumerate(widths):
            lora_a[slot, i * r : i * r + r] = torch.randn(r, in_features, generator=gen) * 0.3
            b_rows[slot, i * r : i * r + r, offset : offset + width] = (
                torch.randn(r, width, generator=gen) * 0.3
            )
            offset += width
    segments, row = [], 0
    while row < 60:
        length = rng.randint(1, 9)
        segments.append((row, row + length, rng.randrange(num_slots - 1)))
        row += length + rng.randint(0, 2)  # rows between runs belong to no adapter
    x = torch.randn(row, in_features, generator=gen)
    slot_ranks = torch.tensor([n * r for r in ranks], dtype=torch.int32)
    return x, lora_a, b_rows, slot_ranks, torch.tensor(segments, dtype=torch.long)


def _subs(widths: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    offsets = [sum(widths[:i]) for i in range(len(widths))]
    return tuple(zip(offsets, widths, strict=True))


@pytest.mark.parametrize(
    ("in_features", "widths", "rank"),
    [(96, (80,), 16), (70, (64, 24, 24), 5), (33, (17, 130), 8), (256, (200,), 64)],
)
def test_runs_match_the_row_kernel_and_the_oracle(
    kernel: NativeRows, in_features: int, widths: tuple[int, ...], rank: int
) -> None:
    x, lora_a, b_rows, slot_ranks, segments = _case(in_features, in_features, widths, rank)
    subs, n = _subs(widths), len(widths)
    x, lora_a, b_rows = x.bfloat16(), lora_a.bfloat16(), b_rows.bfloat16()
    gen = torch.Generator().manual_seed(in_features)
    start = torch.randn(x.shape[0], sum(widths), generator=gen).bfloat16()
    tiled, rows = start.clone(), start.clone()
    assert kernel.run_segments(x, tiled, segments, lora_a, b_rows, slot_ranks, subs, rank)
    covered = torch.cat([torch.arange(s, e) for s, e, _ in segments.tolist()])
    slots = torch.cat([torch.full((e - s,), slot) for s, e, slot in segments.tolist()])
    kernel(x, rows, covered, slots, lora_a, b_rows, slot_ranks, subs, rank)

    assert torch.isfinite(tiled).all()  # nothing beyond a rank or off a block was read
    torch.testing.assert_close(tiled.float(), rows.float(), atol=6e-2, rtol=6e-2)
    other = torch.ones(x.shape[0], dtype=torch.bool)
    other[covered] = False
    assert torch.equal(tiled[other], start[other])  # rows of no run keep their bits
    want = start.double()
    for t, slot in zip(covered.tolist(), slots.tolist(), strict=True):
        r = int(slot_ranks[slot]) // n
        # y rounded to bf16 between the products, as the kernels and a bf16 PEFT model do
        y = (x[t].double() @ lora_a[slot, : n * r].double().T).bfloat16().double()
        for i, (offset, width) in enumerate(subs):
            block = b_rows[slot, i * r : i * r + r, offset : offset + width].double()
            want[t, offset : offset + width] += y[i * r : i * r + r] @ block
    # what is left: out + delta's one rounding (2^-8 relative), and a y whose float32 sum sat
    # on a rounding boundary
    torch.testing.assert_close(tiled.double(), want, atol=2e-2, rtol=2**-7)


def test_a_strided_output_slice_is_written_in_place(kernel: NativeRows) -> None:
    x, lora_a, b_rows, slot_ranks, segments = _case(1, 64, (48,), 8)
    x, lora_a, b_rows = x.bfloat16(), lora_a.bfloat16(), b_rows.bfloat16()
    wide = torch.zeros(x.shape[0], 100, dtype=torch.bfloat16)
    plain = torch.zeros(x.shape[0], 48, dtype=torch.bfloat16)
    assert kernel.run_segments(
        x, wide[:, 20:68], segments, lora_a, b_rows, slot_ranks, ((0, 48),), 8
    )
    assert kernel.run_segments(x, plain, segments, lora_a, b_rows, slot_ranks, ((0, 48),), 8)
    assert torch.equal(wide[:, 20:68], plain)
    assert not wide[:, :20].any() and not wide[:, 68:].any()


def test_other_dtypes_and_builds_decline_the_call(tmp_path: Path) -> None:
    x, lora_a, b_rows, slot_ranks, segments = _case(2, 64, (48,), 8)
    out = torch.zeros(x.shape[0], 48)
    assert not native_rows().run_segments(
        x, out, segments, lora_a, b_rows, slot_ranks, ((0, 48),), 8
    )
    portable = NativeRows(
        build(tmp_path, source=SOURCE, extra_flags=("-mno-avx512bf16", "-mno-fma"))
    )
    assert not portable.runs_bf16
    x, lora_a, b_rows, out = x.bfloat16(), lora_a.bfloat16(), b_rows.bfloat16(), out.bfloat16()
    assert not portable.run_segments(x, out, segments, lora_a, b_rows, slot_ranks, ((0, 48),), 8)
    assert not out.any()
