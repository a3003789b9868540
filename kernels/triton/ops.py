"""LoRA ops: the Triton kernels on CUDA tensors, the PyTorch reference otherwise.

The delta of one LoRA linear layer is ``lora_expand(lora_shrink(x, A, meta), B, meta, out)``;
``lora_add`` does both (on CPU fused into one grouped pass in the inputs' dtype).
``form="segmented"`` suits prefill chunks (long runs of one slot), ``form="gathered"`` suits
decode (one token per sequence, slots in any order); both give the same result.
"""

from __future__ import annotations

import torch

from kernels.cpu.gathered import GatheredKernel, SubOutputs
from kernels.cpu.reference import lora_add_cpu, lora_expand_ref, lora_shrink_ref
from kernels.triton.meta import LoRAForm, LoRAKernelMeta

__all__ = ["LoRAForm", "LoRAKernelMeta", "lora_add", "lora_expand", "lora_shrink"]

_FORMS: tuple[str, ...] = ("segmented", "gathered")


def _check_form(form: str) -> None:
    if form not in _FORMS:
        raise ValueError(f"form must be one of {_FORMS}, got {form!r}")


def lora_shrink(
    x: torch.Tensor, lora_a: torch.Tensor, meta: LoRAKernelMeta, *, form: LoRAForm
) -> torch.Tensor:
    """``out[t] = x[t] @ lora_a[slot[t], :rank[slot[t]]].T``, zero beyond the rank and for slot -1.

    x: [num_tokens, in_features]; lora_a: [num_slots, max_rank, in_features].
    Returns [num_tokens, max_rank] float32.
    """
    _check_form(form)
    if x.is_cuda:
        # Imported here: triton loads only where it runs, and after TRITON_INTERPRET is set.
        from kernels.triton.shrink import lora_shrink_triton

        return lora_shrink_triton(x, lora_a, meta, form=form)
    return lora_shrink_ref(x, lora_a, meta)


def lora_expand(
    y: torch.Tensor,
    lora_b: torch.Tensor,
    meta: LoRAKernelMeta,
    out: torch.Tensor,
    *,
    form: LoRAForm,
) -> None:
    """``out[t] += (y[t, :rank] @ lora_b[slot[t], :, :rank].T).to(out.dtype)``; slot -1 untouched.

    y: [num_tokens, max_rank] float32; lora_b: [num_slots, out_features, max_rank];
    out: [num_tokens, out_features], any float dtype, may be a strided column slice.
    """
    _check_form(form)
    if y.is_cuda:
        from kernels.triton.expand import lora_expand_triton

        lora_expand_triton(y, lora_b, meta, out, form=form)
        return
    lora_expand_ref(y, lora_b, meta, out)


def lora_add(
    x: torch.Tensor,
    lora_a: torch.Tensor,
    lora_b: torch.Tensor,
    meta: LoRAKernelMeta,
    out: torch.Tensor,
    *,
    form: LoRAForm,
    sub_outputs: SubOutputs | None = None,
    cpu_gathered: GatheredKernel | None = None,
) -> None:
    """``out += lora_expand(lora_shrink(x, lora_a, meta), lora_b, meta)``, per token's slot.

    x: [num_tokens, in_features]; lora_a: [num_slots, max_rank, in_features];
    lora_b: [num_slots, out_features, max_rank]; out: [num_tokens, out_features]. On CUDA the
    two Triton kernels run with a float32 intermediate; on CPU ``lora_add_cpu`` runs, which
    needs one dtype for all four tensors, skips the zero blocks of fused stacks when told their
    ``sub_outputs`` and runs short runs through ``cpu_gathered`` (default: the compiled kernel).
    """
    if x.is_cuda:
        lora_expand(lora_shrink(x, lora_a, meta, form=form), lora_b, meta, out, form=form)
        return
    _check_form(form)
    lora_add_cpu(x, lora_a, lora_b, meta, out, sub_outputs, cpu_gathered=cpu_gathered)
