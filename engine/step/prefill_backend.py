"""Pick how prefill chunks attend by timing both on this machine: once, at the first start with
a tuning file, whose choice every later start reads (engine/step/choices/tuning.py).

SDPA's flash kernel, or two matmuls around the native causal softmax (engine/step/attention.py
`prefill_matmul`, the form decode attention already takes), which the native prefill kernel
(kernels/cpu/native/prefill.cpp) computes in one call where it runs: then the kernel is what is timed
against SDPA. On a 2-core AVX512-BF16 AMD EPYC (no AMX) in bf16 the matmuls took 0.51 ms for the
timed 256-token chunk against SDPA's 1.25; in float32 the two were near a tie (1.24 vs 1.37). On
an AVX2 CPU, where oneDNN has no bf16 matmuls, SDPA beat the two matmuls outright and the
kernel's FMA path (bf16 and float32) is the matmul form's contender. On CUDA SDPA is used. Both
compute causal attention with a float32 softmax; the matmul form rounds scores and probabilities
to the dtype between ops, as transformers' eager attention does.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

import torch

from engine.step.attention import PrefillSegment, prefill_matmul, prefill_sdpa
from engine.step.choices.choice import PREFILL_ATTENTION
from engine.step.choices.startup import StartupChoices
from engine.step.choices.timing import best_times
from kernels.cpu.layer import NativeLayer
from kernels.cpu.native.build import built_or_none
from kernels.cpu.prefill import NativePrefill, native_prefill

log = logging.getLogger(__name__)

# The timed problem: one fresh chunk of this many tokens, best of several interleaved repeats.
_CHUNK, _REPEATS = 256, 9
# Two matmuls must be clearly faster: a near tie keeps SDPA (float32 here: 1.24 vs 1.37 ms).
_MIN_GAIN_MATMULS = 1.2
# The native kernel need only not be slower: it rounds as transformers' eager attention does
# (SDPA does not), and its AMX path ran 1.2-1.5x SDPA on 256-512-token chunks, close enough to
# the matmuls' margin that a start-up timing on a busy machine could go either way.
_MIN_GAIN_KERNEL = 1.0
FORMS: tuple[str, ...] = ("auto", "sdpa", "matmul")


def choose_prefill_softmax(
    requested: str,
    native: NativeLayer | None,
    *,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    device: torch.device,
    choices: StartupChoices | None = None,
) -> NativeLayer | None:
    """The softmax kernel for the matmul form, or None for SDPA. `requested` "auto": the form
    saved in the tuning file for this machine and model, or the one timed now (the matmul form
    only where it is clearly faster for this model's shapes; `choices` None: timed, not saved);
    "sdpa" and "matmul" pin the form, as tests that compare two engines token for token need
    (the two round differently in bf16)."""
    if requested not in FORMS:
        raise ValueError(f"prefill_attention must be one of {FORMS}, got {requested!r}")
    usable = (
        native is not None and device.type == "cpu" and dtype in (torch.bfloat16, torch.float32)
    )
    if requested == "matmul" and not usable:
        raise ValueError(
            "prefill_attention 'matmul' needs fused_layer_ops on a CPU and bf16 or fp32, "
            f"got {dtype} on {device.type}"
        )
    choices = choices or StartupChoices()
    if requested != "auto":
        choice = choices.pin(PREFILL_ATTENTION, requested, f"prefill_attention {requested}")
    elif native is None or not usable:
        why = "no fused layer kernels" if native is None else f"{dtype} on {device.type}"
        choice = choices.fix(PREFILL_ATTENTION, "sdpa", f"{why}: SDPA alone")
    else:
        layer = native
        choice = choices.decide(
            PREFILL_ATTENTION,
            ("matmul", "sdpa"),
            lambda: _faster_form(layer, num_heads, num_kv_heads, head_dim, dtype, device),
        )
    log.info("prefill attention: %s (%s)", choice.value, choice.origin())
    return native if choice.value == "matmul" else None


def _faster_form(
    native: NativeLayer,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    device: torch.device,
) -> tuple[str, str]:
    """The form that times faster on one fresh chunk ("matmul" or "sdpa"), and the figures."""
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(_CHUNK, num_heads, head_dim, generator=gen).to(dtype)
    k = torch.randn(_CHUNK, num_kv_heads, head_dim, generator=gen).to(dtype)
    v = torch.randn(_CHUNK, num_kv_heads, head_dim, generator=gen).to(dtype)
    empty = torch.empty(num_kv_heads, 0, head_dim, dtype=dtype)  # unread: nothing cached
    seg = PrefillSegment(0, _CHUNK, 0, None)
    scale = head_dim**-0.5
    kernel = _kernel(head_dim=head_dim, dtype=dtype, device=device)
    matmul_form: Callable[[], object]
    if kernel is not None:  # the chunk's keys and values where the kernel reads them
        k_cache, v_cache = k.transpose(0, 1).contiguous(), v.transpose(0, 1).contiguous()
        matmul_form = functools.partial(kernel, q, k_cache, v_cache, torch.arange(_CHUNK), 0, scale)
    else:
        matmul_form = functools.partial(prefill_matmul, q, k, v, empty, empty, seg, scale, native)
    timings = best_times(
        {
            "matmul": matmul_form,
            "sdpa": lambda: prefill_sdpa(q, k, v, empty, empty, seg, scale),
        },
        _REPEATS,
    )
    gain = _MIN_GAIN_KERNEL if kernel is not None else _MIN_GAIN_MATMULS
    chosen = "matmul" if timings["matmul"] * gain <= timings["sdpa"] else "sdpa"
    form = "the native kernel" if kernel is not None else "two matmuls"
    figures = ", ".join(f"{name} {1e3 * t:.2f} ms" for name, t in timings.items())
    return chosen, f"{figures} ({form}) for a {_CHUNK}-token chunk, {dtype}"


def choose_prefill_kernel(
    softmax: NativeLayer | None, *, head_dim: int, dtype: torch.dtype, device: torch.device
) -> NativePrefill | None:
    """Where the matmul form was chosen and the CPU runs the kernel for the dtype (bf16 on
    AVX512-BF16 or AVX2 + FMA, float32 on AVX2 + FMA): the kernel that computes it in one call
    (kernels/cpu/native/prefill.cpp: the same values bit for bit in most cases tested, 1.1-1.5x faster
    than the two matmuls on 64-512-token chunks on AVX512-BF16, causal blocks skipped); else
    None."""
    if softmax is None:
        return None
    return _kernel(head_dim=head_dim, dtype=dtype, device=device)


def _kernel(*, head_dim: int, dtype: torch.dtype, device: torch.device) -> NativePrefill | None:
    if device.type != "cpu" or dtype not in (torch.bfloat16, torch.float32):
        return None
    kernel = built_or_none(native_prefill, "native prefill attention unavailable; two matmuls")
    return kernel if kernel is not None and kernel.supports(dtype, device, head_dim) else None
