"""The hand-written short-run kernel (kernels/cpu/native/rows.cpp through kernels/cpu/rows.py)
against the same function run eager (kernels/cpu/gathered.py), its fallbacks, and its build
cache. The stacks here use the CPU storage of lora/layers.py (B stored [S, R, out] and seen
transposed), the layout the C++ kernel takes; NaN lies beyond every slot's rank, so a read of
padding shows.

Tolerances: float32 1e-5 (the same products, another summation order); bfloat16 6e-2, as for
the compiled kernel: y and the sum may each round one ulp the other way.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kernels.cpu.gathered import gathered_rows
from kernels.cpu.native.build import NativeBuildError, build
from kernels.cpu.reference import lora_add_cpu
from kernels.cpu.rows import MAX_FUSED_RANK, SOURCE, NativeRows, native_rows
from tests.kernels.lora_cases import (
    MIXES,
    assert_untouched,
    fused_output,
    make_case,
    oracle,
    out_slice,
)


def _stored(lora_b: torch.Tensor) -> torch.Tensor:
    """[S, out, R] as lora/layers.py keeps it on CPU: a transposed view of [S, R, out]."""
    return lora_b.transpose(1, 2).contiguous().transpose(1, 2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", MIXES)
def test_native_matches_the_kernel_run_eager_and_touches_only_its_rows(
    kind: str, dtype: torch.dtype
) -> None:
    meta, x, lora_a, lora_b = make_case(kind, 40, dtype)  # NaN beyond each slot's rank
    lora_b = _stored(lora_b)
    eager, native = fused_output(40, dtype), fused_output(40, dtype)
    before = native.clone()
    lora_add_cpu(x, lora_a, lora_b, meta, out_slice(eager), cpu_gathered=gathered_rows)
    lora_add_cpu(x, lora_a, lora_b, meta, out_slice(native), cpu_gathered=native_rows())
    assert torch.isfinite(native).all()
    tol = 1e-5 if dtype == torch.float32 else 6e-2
    torch.testing.assert_close(native.float(), eager.float(), atol=tol, rtol=tol)
    assert_untouched(before, native, meta)


@pytest.mark.parametrize("kind", MIXES)
def test_the_portable_bf16_build_matches_the_avx512_bf16_one(kind: str, tmp_path: Path) -> None:
    """Where the CPU has AVX512-BF16 the bf16 shrink runs vdpbf16ps; the portable loop (built
    here with -mno-avx512bf16, what other CPUs get) computes the same rows."""
    portable = NativeRows(build(tmp_path, source=SOURCE, extra_flags=("-mno-avx512bf16",)))
    meta, x, lora_a, lora_b = make_case(kind, 40, torch.bfloat16)
    lora_b = _stored(lora_b)
    fast, slow = fused_output(40, torch.bfloat16), fused_output(40, torch.bfloat16)
    lora_add_cpu(x, lora_a, lora_b, meta, out_slice(fast), cpu_gathered=native_rows())
    lora_add_cpu(x, lora_a, lora_b, meta, out_slice(slow), cpu_gathered=portable)
    assert torch.isfinite(slow).all()
    torch.testing.assert_close(fast.float(), slow.float(), atol=6e-2, rtol=6e-2)


def test_native_float32_matches_the_float64_oracle() -> None:
    meta, x, lora_a, lora_b = make_case("all_distinct", 33, torch.float32)
    lora_b = _stored(lora_b)
    out = torch.zeros(33, lora_b.shape[1])
    lora_add_cpu(x, lora_a, lora_b, meta, out, cpu_gathered=native_rows())
    torch.testing.assert_close(out.double(), oracle(x, lora_a, lora_b, meta), atol=1e-5, rtol=1e-5)


def test_native_fused_stacks_write_each_sub_projection_from_its_own_block() -> None:
    # two sub-projections fused (gate_up-like), rank 4 each; B's off-diagonal blocks are NaN
    # (zero in the engine): the kernel must read only sub i's rows for sub i's columns
    gen = torch.Generator().manual_seed(3)
    num_slots, r, in_features = 5, 4, 24
    subs = ((0, 7), (7, 9))
    lora_a = torch.randn(num_slots, 2 * r, in_features, generator=gen)
    b_rows = torch.full((num_slots, 2 * r, 16), float("nan"))
    for i, (offset, width) in enumerate(subs):
        b_rows[:, i * r : i * r + r, offset : offset + width] = torch.randn(
            num_slots, r, width, generator=gen
        )
    x = torch.randn(6, in_features, generator=gen)
    rows, slots = torch.arange(6), torch.tensor([0, 0, 2, 4, 4, 1])
    ranks = torch.full((num_slots,), 2 * r, dtype=torch.int32)
    out = torch.zeros(6, 16)
    native_rows()(x, out, rows, slots, lora_a, b_rows, ranks, subs, r)
    for t, slot in enumerate(slots.tolist()):
        y = x[t] @ lora_a[slot].T  # [2r]
        for i, (offset, width) in enumerate(subs):
            want = y[i * r : i * r + r] @ b_rows[slot, i * r : i * r + r, offset : offset + width]
            torch.testing.assert_close(out[t, offset : offset + width], want, atol=1e-5, rtol=1e-5)


def test_other_dtypes_and_layouts_go_to_the_fallback() -> None:
    calls: list[torch.dtype] = []

    def fallback(x: torch.Tensor, *args: object) -> None:
        calls.append(x.dtype)
        gathered_rows(x, *args)  # type: ignore[arg-type]

    kernel = NativeRows(native_rows().library, fallback)
    meta, x, lora_a, lora_b = make_case("zipf", 20, torch.float16, padding=0.0)
    out = torch.zeros(20, lora_b.shape[1], dtype=torch.float16)
    lora_add_cpu(x, lora_a, _stored(lora_b), meta, out, cpu_gathered=kernel)  # float16
    assert calls == [torch.float16]
    meta, x, lora_a, lora_b = make_case("zipf", 20, torch.float32, padding=0.0)
    out = torch.zeros(20, lora_b.shape[1])
    lora_add_cpu(x, lora_a, lora_b, meta, out, cpu_gathered=kernel)  # B not in CPU storage
    assert calls == [torch.float16, torch.float32]
    lora_add_cpu(x, lora_a, _stored(lora_b), meta, out, cpu_gathered=kernel)
    assert calls == [torch.float16, torch.float32]  # the plain layout ran natively
    # stacks wider than the C++ kernel's stack buffer for a row's shrink output
    wide_a = torch.zeros(lora_a.shape[0], MAX_FUSED_RANK + 1, lora_a.shape[2])
    wide_b = torch.zeros(lora_a.shape[0], MAX_FUSED_RANK + 1, out.shape[1])
    rows, slots = torch.arange(2), torch.zeros(2, dtype=torch.long)
    ranks = torch.full((lora_a.shape[0],), MAX_FUSED_RANK + 1, dtype=torch.int32)
    kernel(
        x[:2], out[:2], rows, slots, wide_a, wide_b, ranks, ((0, out.shape[1]),), MAX_FUSED_RANK + 1
    )
    assert calls == [torch.float16, torch.float32, torch.float32]


def test_the_build_is_cached_and_reused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    library = build(tmp_path, source=SOURCE)
    assert library.exists() and library.parent == tmp_path / "loragate_native"

    def no_compiler(*args: object, **kwargs: object) -> None:
        raise AssertionError("the compiler ran again")

    monkeypatch.setattr("kernels.cpu.native.build.subprocess.run", no_compiler)
    assert build(tmp_path, source=SOURCE) == library
    assert list(library.parent.iterdir()) == [library]  # no partial file left behind


def test_a_failing_compiler_raises_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CXX", "false")  # exits 1, writes nothing
    with pytest.raises(NativeBuildError, match="false failed"):
        build(tmp_path, source=SOURCE)
    assert list((tmp_path / "loragate_native").iterdir()) == []
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    with pytest.raises(NativeBuildError, match="no-such-compiler"):
        build(tmp_path, source=SOURCE)
