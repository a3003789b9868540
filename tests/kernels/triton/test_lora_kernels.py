"""LoRA shrink/expand: Triton kernels (under TRITON_INTERPRET=1) against the PyTorch reference.

Tolerances (abs and rel, through torch.testing.assert_close):
- float32 inputs: 1e-4. Kernel and reference both accumulate float32 products, in a different
  order; observed differences are ~1e-5 on values of magnitude ~10.
- float16 inputs: shrink 1e-4 (float32 output from the same float16 values); expand 1e-2, since
  an output rounded to float16 may land one float16 ulp (~1e-3 relative) apart.
- bfloat16 inputs: 2e-2 on expand: the interpreter rounds float32 -> bfloat16 towards zero (a GPU
  rounds to nearest even), so one bfloat16 ulp (~8e-3 relative) of disagreement is expected here.
- reference vs a per-token float64 loop (the reference's own oracle): 1e-5.
- segmented vs gathered form: 1e-5 (same products, different summation order).

Stacks carry NaN in every padded rank row/column and in empty slots: any read of padding by
the reference or a kernel shows up as NaN in its output.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest
import torch

from kernels.cpu.reference import lora_expand_ref, lora_shrink_ref
from kernels.triton.meta import LoRAKernelMeta
from kernels.triton.ops import lora_expand, lora_shrink
from tests.kernels.lora_cases import (
    FORMS,
    MAX_RANK,
    MIXES,
    OUT_FEATURES,
    assert_untouched,
    fused_output,
    make_case,
    oracle,
    out_slice,
)

TritonOps = tuple[Callable[..., torch.Tensor], Callable[..., None]]


@pytest.fixture(scope="module")
def triton_ops() -> TritonOps:
    # Imported here so that conftest has set TRITON_INTERPRET before triton loads.
    from kernels.triton.expand import lora_expand_triton
    from kernels.triton.shrink import lora_shrink_triton

    return lora_shrink_triton, lora_expand_triton


def test_build_merges_consecutive_slots_into_segments() -> None:
    meta = LoRAKernelMeta.build([3, 3, -1, -1, 0, 3, 3, 3], [8, 0, 0, 16], 16, "cpu")
    assert meta.seg_starts.tolist() == [0, 2, 4, 5, 8]
    assert meta.seg_slots.tolist() == [3, -1, 0, 3]
    assert meta.token_slots.dtype == meta.seg_starts.dtype == torch.int32
    assert meta.active_slots == (0, 3)
    assert meta.max_segment_len == 3 and meta.has_lora
    empty = LoRAKernelMeta.build([], [8], 8, "cpu")
    assert empty.seg_starts.tolist() == [0] and empty.num_segments == 0 and not empty.has_lora
    assert not LoRAKernelMeta.build([-1, -1], [8], 8, "cpu").has_lora


@pytest.mark.parametrize(
    ("token_slots", "slot_ranks", "name"),
    [([0, 2], [8, 8], "token_slots"), ([-2], [8], "token_slots"), ([0], [8, 32], "slot_ranks")],
)
def test_build_rejects_out_of_range(
    token_slots: list[int], slot_ranks: list[int], name: str
) -> None:
    with pytest.raises(ValueError, match=name):
        LoRAKernelMeta.build(token_slots, slot_ranks, 16, "cpu")


@pytest.mark.parametrize("kind", MIXES)
def test_reference_matches_float64_loop(kind: str) -> None:
    meta, x, lora_a, lora_b = make_case(kind, 33, torch.float32)
    out = torch.zeros(meta.num_tokens, OUT_FEATURES)  # [T, out_features]
    lora_expand_ref(lora_shrink_ref(x, lora_a, meta), lora_b, meta, out)
    torch.testing.assert_close(out.double(), oracle(x, lora_a, lora_b, meta), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("num_tokens", [1, 7, 33])
@pytest.mark.parametrize("kind", MIXES)
def test_kernels_match_reference(
    kind: str, num_tokens: int, dtype: torch.dtype, triton_ops: TritonOps
) -> None:
    shrink, expand = triton_ops
    meta, x, lora_a, lora_b = make_case(kind, num_tokens, dtype)
    y_ref = lora_shrink_ref(x, lora_a, meta)  # [T, max_rank] float32
    fused_ref = fused_output(num_tokens, dtype)
    lora_expand_ref(y_ref, lora_b, meta, out_slice(fused_ref))
    expand_tol = 1e-4 if dtype == torch.float32 else 1e-2

    results = {}
    for form in FORMS:
        y = shrink(x, lora_a, meta, form=form)
        torch.testing.assert_close(y, y_ref, atol=1e-4, rtol=1e-4)
        fused = fused_output(num_tokens, dtype)
        expand(y_ref, lora_b, meta, out_slice(fused), form=form)
        torch.testing.assert_close(fused, fused_ref, atol=expand_tol, rtol=expand_tol)
        assert_untouched(fused_output(num_tokens, dtype), fused, meta)
        results[form] = (y, fused)
    # Both forms agree with each other more tightly than either needs to agree with the reference.
    torch.testing.assert_close(
        results["segmented"][0], results["gathered"][0], atol=1e-5, rtol=1e-5
    )


def test_bfloat16_expand_within_one_ulp(triton_ops: TritonOps) -> None:
    shrink, expand = triton_ops
    meta, x, lora_a, lora_b = make_case("with_base", 17, torch.bfloat16)
    y_ref = lora_shrink_ref(x, lora_a, meta)
    fused_ref = fused_output(17, torch.bfloat16)
    lora_expand_ref(y_ref, lora_b, meta, out_slice(fused_ref))
    for form in FORMS:
        torch.testing.assert_close(shrink(x, lora_a, meta, form=form), y_ref, atol=1e-4, rtol=1e-4)
        fused = fused_output(17, torch.bfloat16)
        expand(y_ref, lora_b, meta, out_slice(fused), form=form)
        torch.testing.assert_close(fused, fused_ref, atol=2e-2, rtol=2e-2)


def test_batch_without_adapters_is_untouched(triton_ops: TritonOps) -> None:
    shrink, expand = triton_ops
    meta = LoRAKernelMeta.build([-1] * 5, [8, 16], 16, "cpu")
    x, lora_a = torch.randn(5, 32), torch.randn(2, 16, 32)  # [T, in], [S, R, in]
    lora_b, out = torch.randn(2, 24, 16), torch.randn(5, 24)  # [S, out, R], [T, out]
    before = out.clone()
    for form in FORMS:
        assert torch.equal(shrink(x, lora_a, meta, form=form), torch.zeros(5, 16))
        expand(torch.randn(5, 16), lora_b, meta, out, form=form)
        assert torch.equal(out, before)


def test_ops_on_cpu_run_the_reference() -> None:
    meta, x, lora_a, lora_b = make_case("with_base", 9, torch.float32)
    out = torch.zeros(9, OUT_FEATURES)  # [T, out_features]
    for form in FORMS:
        out.zero_()
        lora_expand(lora_shrink(x, lora_a, meta, form=form), lora_b, meta, out, form=form)
        torch.testing.assert_close(
            out.double(), oracle(x, lora_a, lora_b, meta), atol=1e-5, rtol=1e-5
        )
    with pytest.raises(ValueError, match="form"):
        lora_shrink(x, lora_a, meta, form="bgmv")  # type: ignore[arg-type]


def _bad_shrink_args(name: str) -> tuple[torch.Tensor, torch.Tensor, LoRAKernelMeta]:
    meta, x, lora_a, _ = make_case("zipf", 5, torch.float32)
    if name == "x":
        return x[:, :-1], lora_a, meta
    if name == "lora_a":
        return x, lora_a[:, :, :-1].contiguous(), meta
    return x, lora_a, LoRAKernelMeta.build([0] * 4, meta.slot_ranks.tolist(), MAX_RANK, "cpu")


@pytest.mark.parametrize("name", ["x", "lora_a", "meta"])
def test_shrink_launcher_names_the_bad_argument(name: str, triton_ops: TritonOps) -> None:
    shrink, _ = triton_ops
    with pytest.raises(ValueError, match=name):
        shrink(*_bad_shrink_args(name), form="segmented")


@pytest.mark.parametrize("name", ["y", "lora_b", "out", "meta"])
def test_expand_launcher_names_the_bad_argument(name: str, triton_ops: TritonOps) -> None:
    _, expand = triton_ops
    meta, _, _, lora_b = make_case("zipf", 5, torch.float32)
    y, out = torch.zeros(5, MAX_RANK), torch.zeros(5, OUT_FEATURES)  # [T, R], [T, out]
    if name == "y":
        y = y.half()
    elif name == "lora_b":
        lora_b = lora_b[:, :, :32].contiguous()
    elif name == "out":
        out = torch.zeros(OUT_FEATURES, 5).T  # right shape, columns not contiguous
    else:
        meta = LoRAKernelMeta.build([0] * 5, [8], MAX_RANK, "cpu")
    with pytest.raises(ValueError, match=name):
        expand(y, lora_b, meta, out, form="gathered")


@pytest.mark.gpu
def test_kernels_on_cuda_match_reference() -> None:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: the Triton kernels run only under the interpreter here")
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("TRITON_INTERPRET=1: run with TRITON_INTERPRET=0 to compile for the GPU")
    for kind in MIXES:
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            meta_cpu, x, lora_a, lora_b = make_case(kind, 33, dtype)
            ranks = meta_cpu.slot_ranks.tolist()
            meta = LoRAKernelMeta.build(meta_cpu.token_slots.tolist(), ranks, MAX_RANK, "cuda")
            fused_ref = fused_output(33, dtype)
            lora_expand_ref(
                lora_shrink_ref(x, lora_a, meta_cpu), lora_b, meta_cpu, out_slice(fused_ref)
            )
            tol = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 2e-2}[dtype]
            for form in FORMS:
                fused = fused_output(33, dtype).cuda()
                y = lora_shrink(x.cuda(), lora_a.cuda(), meta, form=form)
                lora_expand(y, lora_b.cuda(), meta, out_slice(fused), form=form)
                torch.testing.assert_close(fused.cpu(), fused_ref, atol=tol, rtol=tol)
