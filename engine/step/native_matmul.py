"""Which steps multiply by the hand-written kernel (kernels/cpu/matmul.py) instead of oneDNN,
decided for the model's packed linears by a timing taken once per machine and model: at the
first start with a tuning file, whose choice every later start reads
(engine/step/choices/tuning.py).

At a few rows a step's matmuls only stream their weights, and oneDNN's call costs ~15-20 us
before it streams: on a 2-core AVX512-BF16 EPYC whose copy ran at 31 GB/s, the small model's
49 matmuls at one row took 9.5 ms through oneDNN and 7.7 ms through the kernel. At more rows
the kernel, tiled, kept up with oneDNN on the EPYCs measured (1.1-1.7x at 1-64 rows, 1.01-1.04x
at 200-2048 rows, session 12). On a CPU with AMX both multiply by AMX's tiles; the kernel ran
1.3x oneDNN at 1-8 rows and 1.03-1.16x at 64-512 on two cores of an AMX Xeon, but 0.81x at
512 rows on one (session 13). On an AVX2-only CPU oneDNN has no bf16 kernels at all and the
kernel's FMA path multiplies bf16 weights at the float32 rate; float32 models go to the same
path there. So "auto" times both on the model's own weights at 1, 8, 64, 512, 1024 and 2048
rows, the fused gate/up projection as a step runs it (the kernel's pass with its SiLU against
oneDNN's matmul and then silu_mul):

- the kernel at least as fast everywhere (within the timing's noise): it takes every step and
  oneDNN's copy of the weights is dropped (one copy, as before);
- clearly faster at the fewest rows and no slower up to some row count: it takes steps up to
  there over a second copy of the weights (their memory doubles), if that copy fits in a
  quarter of the memory free;
- otherwise oneDNN alone. CUDA, float16 and CPUs without the instructions keep oneDNN.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from engine.models.layer_ops import LayerOps
from engine.step.choices.choice import NATIVE_MATMUL, PACKED_FLOAT32
from engine.step.choices.startup import StartupChoices
from engine.step.choices.timing import best_times
from engine.step.packed_linear import PackedLinear, can_pack, pack_linears, packing_pays
from kernels.cpu.layer import native_layer
from kernels.cpu.matmul import GATE_UP_GROUP, NativeMatmul, native_matmul
from kernels.cpu.native.build import built_or_none

log = logging.getLogger(__name__)

MODES: tuple[str, ...] = ("auto", "on", "off")
# 2048: a full prefill step at the default max_num_batched_tokens. On a 2-core AMX Xeon the
# kernel kept up with oneDNN to 512 rows and ran at 0.63x its speed at 2048 (session 13);
# 1024: there it still led (session 17), and a step with a prompt or two beside the decodes
# (500-1000 rows) fell between the two and went to oneDNN.
TIMED_ROWS: tuple[int, ...] = (1, 8, 64, 512, 1024, 2048)
# At or above this everywhere, the kernel takes every step: a tie is worth one copy of the
# weights instead of two.
_EVERY_ROW_RATIO = 0.97
# Beside oneDNN (the weights' memory doubled) the kernel must win by more than the noise.
_MIN_GAIN = 1.03
_REPEATS = 7
# Above this many rows one layer's projections are timed, not the whole model: the matmuls
# are compute-bound there and the time scales with the weights.
_WHOLE_MODEL_ROWS = 8
# The second copy may take at most this share of the memory free when the engine starts.
_MEMORY_SHARE = 0.25
# What the choice can be, as the tuning file keeps it: every step, none, or steps up to a count.
_VALUES = ("every", "none", *map(str, TIMED_ROWS))


@dataclass(frozen=True)
class NativeMatmulUse:
    max_rows: int | None  # steps of up to this many rows go to the kernel; None: every step
    why: str  # for the start-up log: the mode, the reason, or the timings

    @property
    def used(self) -> bool:
        return self.max_rows is None or self.max_rows > 0

    def describe(self) -> str:
        if self.max_rows is None:
            return "every step"
        return f"steps of up to {self.max_rows} rows" if self.max_rows else "no"


def prepare_linears(
    model: nn.Module,
    requested: str,
    dtype: torch.dtype,
    device: torch.device,
    *,
    pack: bool,
    choices: StartupChoices | None = None,
) -> tuple[int, NativeMatmulUse]:
    """Pack the model's linears (engine/step/packed_linear.py) and install the kernel where it pays:
    how many were packed, and what the kernel does. Where oneDNN has no kernels for the dtype
    (bf16 on AVX2) but the matmul kernel does, the linears are wrapped over their plain weight
    so the start-up timing can weigh the kernel against F.linear. `pack` False: nothing is
    packed (and the kernel, having no packed linear to take, is not used). The timed choices
    (float32 packing, the kernel's rows) come from `choices` (engine/step/choices/startup.py:
    saved in the tuning file, or timed now; None: timed, not saved)."""
    choices = choices or StartupChoices()
    packed = 0
    if not pack:
        pass
    elif can_pack(dtype, device):
        if dtype is torch.float32:  # bf16 packing always pays where oneDNN has it: not timed
            choice = choices.decide(
                PACKED_FLOAT32, ("yes", "no"), lambda: _yes_no(*packing_pays(model, dtype))
            )
            pays, figures = choice.value == "yes", choice.origin()
        else:
            pays, figures = packing_pays(model, dtype)
        log.info("packed linear weights: %s (%s)", "yes" if pays else "no", figures)
        packed = pack_linears(model) if pays else 0
    elif requested != "off" and device.type == "cpu" and dtype in (torch.bfloat16, torch.float32):
        kernel = built_or_none(native_matmul, "native matmul kernel unavailable")
        if kernel is not None and kernel.takes(dtype):
            packed = pack_linears(model, onednn=False)
            log.info(
                "linear weights wrapped for the matmul kernel (oneDNN has no %s kernels)", dtype
            )
    use = use_native_matmul(model, requested, dtype, choices)
    log.info("native matmul kernel: %s (%s)", use.describe(), use.why)
    return packed, use


def _yes_no(pays: bool, figures: str) -> tuple[str, str]:
    return "yes" if pays else "no", figures


def use_native_matmul(
    model: nn.Module, requested: str, dtype: torch.dtype, choices: StartupChoices | None = None
) -> NativeMatmulUse:
    """Install the kernel on every packed linear of `model` where `requested` (auto, on, off)
    and this machine say so (auto: the rows saved in the tuning file for this machine and
    model, or timed now); returns what it did and why."""
    if requested not in MODES:
        raise ValueError(f"native_matmul must be one of {MODES}, got {requested!r}")
    choices = choices or StartupChoices()
    if requested == "off":
        choices.pin(NATIVE_MATMUL, "none", "native_matmul off")
        return NativeMatmulUse(0, "off")
    linears = [m for m in model.modules() if isinstance(m, PackedLinear)]
    # The model's side first: a float32 or CUDA engine never builds the kernel's library.
    reason = _unusable(linears, dtype)
    kernel = None
    if reason is None:
        kernel = built_or_none(native_matmul, "native matmul kernel unavailable; oneDNN instead")
    if reason is None and (kernel is None or not kernel.takes(dtype)):
        reason = f"the CPU has no {dtype} matmul instructions for it (or no C++ compiler)"
    if reason is not None:
        if requested == "on":
            raise ValueError(f"native_matmul 'on': {reason}")
        choices.fix(NATIVE_MATMUL, "none", reason)
        return NativeMatmulUse(0, reason)
    assert kernel is not None
    widths = _gate_up_widths(model)
    if requested == "on":
        choices.pin(NATIVE_MATMUL, "every", "native_matmul on")
        _install(linears, kernel, None, widths)
        return NativeMatmulUse(None, "on")
    # Timed with both copies; where a second copy of every weight would not fit, on the first
    # layer's projections alone (their figures at a few rows then read weights from cache).
    extra = sum(m.in_features * m.out_features * dtype.itemsize for m in linears)
    free = _free_memory()
    fits = free is None or extra <= _MEMORY_SHARE * free
    timed = linears if fits else linears[:4]
    choice = choices.decide(NATIVE_MATMUL, _VALUES, lambda: _timed_rows(timed, kernel, widths))
    limit, why = _max_rows(choice.value), choice.origin()
    if limit and not fits:
        limit = 0
        why += f"; a second copy ({extra / 2**20:.0f} MiB) exceeds a quarter of free memory"
    if limit is None:  # layer by layer: oneDNN's copy goes as the kernel's comes
        _install(linears, kernel, None, widths)
    else:
        _install(linears, kernel if limit else None, limit, widths if limit else None)
    return NativeMatmulUse(limit, why)


def _max_rows(value: str) -> int | None:
    """A saved or timed value ("every", "none", a row count) as NativeMatmulUse's max_rows."""
    return None if value == "every" else 0 if value == "none" else int(value)


def _timed_rows(
    timed: list[PackedLinear], kernel: NativeMatmul, widths: dict[int, int]
) -> tuple[str, str]:
    """Up to which rows the kernel pays on `timed` ("every", "none" or a row count; both copies
    left installed on `timed`), and the figures."""
    _install(timed, kernel, 0, widths)
    ratios = {rows: _ratio(timed, rows, widths) for rows in TIMED_ROWS}
    figures = "oneDNN / kernel time at " + ", ".join(f"{r} rows {x:.2f}" for r, x in ratios.items())
    if min(ratios.values()) >= _EVERY_ROW_RATIO:
        return "every", figures
    limit = 0
    for rows, ratio in ratios.items():
        # the first row count must pay for the second copy; once it is there, larger steps
        # go to the kernel wherever it is no slower. A tie within the noise neither extends
        # the limit nor ends it (one noisy size at 0.99 once kept 1024-row steps, 1.16x
        # faster by the kernel, on oneDNN); a clear loss ends it.
        if limit == 0 and ratio < _MIN_GAIN:
            break
        if limit and ratio < _EVERY_ROW_RATIO:
            break
        if limit == 0 or ratio >= 1.0:
            limit = rows
    return str(limit) if limit else "none", figures


def _install(
    linears: list[PackedLinear],
    kernel: NativeMatmul | None,
    max_rows: int | None,
    gate_up: dict[int, int] | None = None,
) -> None:
    for m in linears:
        m.use_native(kernel, max_rows, (gate_up or {}).get(id(m)))


def _gate_up_widths(model: nn.Module) -> dict[int, int]:
    """id -> width of each packed fused gate/up projection whose SiLU the kernel can apply in
    the same pass: a module's `gate_up_proj` (or the base inside its LoRA wrapper) of
    2 x its `intermediate` outputs (engine/models/llama.py's MLP)."""
    widths = {}
    for m in model.modules():
        proj, width = getattr(m, "gate_up_proj", None), getattr(m, "intermediate", None)
        base = getattr(proj, "base", proj)
        if (
            isinstance(base, PackedLinear)
            and isinstance(width, int)
            and width % GATE_UP_GROUP == 0
            and base.out_features == 2 * width
        ):
            widths[id(base)] = width
    return widths


def _unusable(linears: list[PackedLinear], dtype: torch.dtype) -> str | None:
    if dtype not in (torch.bfloat16, torch.float32):
        return f"the kernel is bf16 or float32, the model runs {dtype}"
    if not linears:
        return "no packed linear layers"
    if any(m.in_features % 2 for m in linears):
        return "a linear layer has an odd input width"
    return None


def _free_memory() -> int | None:
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return None


def matmul_steps(
    linears: list[PackedLinear], rows: int, gate_up: dict[int, int] | None = None
) -> tuple[Callable[[], None], Callable[[], None]]:
    """Every linear once at `rows` rows, as a step runs them (each weight from memory): one
    run through oneDNN, one through the kernel. Both copies must be installed
    (`use_native(kernel, max_rows)` with a limit). `gate_up`: id -> width of the fused gate/up
    projections installed with their SiLU (`_gate_up_widths`): those run as a step runs them,
    oneDNN's matmul and then silu_mul against the kernel's one pass."""
    inputs = {m.in_features: torch.randn(rows, m.in_features).to(m.dtype) for m in linears}
    widths = gate_up or {}
    silu_mul = _silu_mul()

    def onednn() -> None:
        for m in linears:
            y = m.reference(inputs[m.in_features])
            if id(m) in widths:
                silu_mul(y, widths[id(m)])

    def kernel() -> None:
        for m in linears:
            assert m.native is not None
            native, packed = m.native
            x = inputs[m.in_features]
            if id(m) in widths:
                native.silu(x, packed, widths[id(m)], m.native_bias)
            else:
                native(x, packed, m.out_features, m.bias)

    return onednn, kernel


def _silu_mul() -> Callable[[torch.Tensor, int], torch.Tensor]:
    """What a step runs after oneDNN's gate/up matmul: LayerOps' silu_mul (the native kernel
    where it builds, else PyTorch's operators)."""
    return LayerOps(built_or_none(native_layer, "native layer kernels unavailable")).silu_mul


def _ratio(linears: list[PackedLinear], rows: int, gate_up: dict[int, int]) -> float:
    """oneDNN's time over the kernel's at `rows` rows, best of a few each, interleaved (so a
    busy moment of the machine hits both): the whole model's weights at a few rows, the first
    layer's projections (Llama: qkv, o, gate_up, down) above."""
    timed = linears if rows <= _WHOLE_MODEL_ROWS else linears[:4]
    onednn, kernel = matmul_steps(timed, rows, gate_up)
    timings = best_times({"onednn": onednn, "kernel": kernel}, _REPEATS)
    return timings["onednn"] / timings["kernel"]
