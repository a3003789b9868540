"""The hand-written CPU kernels (kernels/cpu/native/*.cpp): built once per machine with the system's
C++ compiler, cached on disk beside inductor's artefacts, called through ctypes. This module
builds any of them and wraps the LoRA short-run kernel (kernels/cpu/native/rows.cpp);
kernels/cpu/attention.py wraps decode attention.

The short-run kernel computes what `kernels.cpu.gathered.gathered_rows` states, for bfloat16
and float32 with plain layouts (unit column strides, contiguous stacks: what lora/layers.py
keeps on CPU); any other call goes to the inductor-compiled kernel. Why a C kernel beside the
compiled one: on the decode step of 1,000 adapters (~28 distinct ones over 34 rows) it reads the
adapters' weights ~1.9x faster a step and a call costs a few microseconds against inductor's
~20-30 (48 calls a step); bench/RESULTS.md has the figures.

OpenMP: the library links the `libgomp.so.1` soname, which resolves to the one PyTorch has
already loaded, so the kernel's threads are PyTorch's; it is told `torch.get_num_threads()`.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch

from kernels.cpu.gathered import GatheredKernel, compiled_gathered_rows

T = TypeVar("T")
log = logging.getLogger(__name__)

SOURCE = Path(__file__).parent / "native" / "rows.cpp"
# headers every kernel source may include; their text is part of each library's cache key
HEADERS = tuple(
    Path(__file__).parent / "native" / name
    for name in (
        "amx.h",
        "attention_bf16.h",
        "bf16.h",
        "vec_math.h",
        "dot_tile.h",
        "fma_tile.h",
        "lora_runs.h",
        "lora_runs_fma.h",
        "matmul_amx.h",
        "matmul_rows.h",
        "prefill_amx.h",
        "prefill_fma.h",
        "prefill_schedule.h",
        "softmax_bf16.h",
        "steal.h",
    )
)
# -fno-trapping-math: without it GCC keeps every float select (a clamp, a sign test) a branch, and
# loops with one (the softmax's and SiLU's exp) stay scalar; the kernels read no FP exception
# flags, and no value changes.
FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c++17", "-fno-trapping-math")
_ENTRIES = {torch.bfloat16: "lora_rows_bf16", torch.float32: "lora_rows_f32"}
_P, _I = ctypes.c_void_p, ctypes.c_int64
_ARGTYPES = [_P, _I, _P, _I, _P, _P, _I, _P, _I, _P, _I, _P, _P, _I, _I, _I]
_RUNS_ARGTYPES: list[Any] = [_P, _I, _P, _I, _P, _I, _P, _I, _P, _I, _P, _P, _I, _I, _I]
# rows.cpp holds a row's shrink output on the stack: n * rank <= 3 * 256 floats
MAX_FUSED_RANK = 3 * 256


class NativeBuildError(RuntimeError):
    """No C++ compiler, or it failed: the compiled (inductor) kernel runs instead."""


def built_or_none(make: Callable[[], T], what: str) -> T | None:
    """`make()` (a kernel built on first call), or None with a warning naming `what` (the
    caller's fallback, e.g. "fused layer kernels unavailable; PyTorch operators instead")
    where it cannot be built."""
    try:
        return make()
    except NativeBuildError as exc:
        log.warning("%s (%s)", what, exc)
        return None


def cache_root() -> Path:
    """Where inductor caches (TORCHINDUCTOR_CACHE_DIR, which the engine points at its
    compile_cache_dir, else inductor's default), so one directory holds every artefact."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    return Path(cache_dir())


def _compiler() -> str:
    compiler = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if not compiler:
        raise NativeBuildError("no C++ compiler (set CXX, or install g++)")
    return compiler


def _cpu_flags() -> str:
    """-march=native builds for this CPU: the cache key names its features."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.processor()


def build(
    cache_dir: Path | None = None, source: Path = SOURCE, extra_flags: tuple[str, ...] = ()
) -> Path:
    """The shared library for `source`, this compiler and CPU, compiled if not cached yet.
    extra_flags: appended to FLAGS (tests build the portable paths with -mno-avx512f)."""
    compiler = _compiler()
    flags = (*FLAGS, *extra_flags)
    texts = [path.read_text() for path in (source, *HEADERS)]
    key = hashlib.sha256(
        "\0".join([*texts, compiler, *flags, platform.machine(), _cpu_flags()]).encode()
    ).hexdigest()[:16]
    directory = (cache_dir or cache_root()) / "loragate_native"
    library = directory / f"{source.stem}-{key}.so"
    if library.exists():
        return library
    directory.mkdir(parents=True, exist_ok=True)
    # built under a temporary name and renamed: processes building at once never load half a file
    fd, partial = tempfile.mkstemp(dir=directory, suffix=".so.partial")
    os.close(fd)
    try:
        result = subprocess.run(
            [compiler, *flags, f"-I{source.parent}", str(source), "-o", partial],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if result.returncode != 0:
            raise NativeBuildError(f"{compiler} failed: {result.stderr.strip()[-500:]}")
        os.replace(partial, library)
    except (OSError, subprocess.SubprocessError) as exc:
        raise NativeBuildError(f"{compiler}: {exc}") from exc
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    return library


def load_entries(
    library: Path, names: dict[torch.dtype, str], argtypes: list[Any]
) -> dict[torch.dtype, Any]:
    """The library's entry point for each dtype, typed for ctypes (all return void)."""
    lib = ctypes.CDLL(str(library))
    entries = {}
    for dtype, name in names.items():
        entry = getattr(lib, name)
        entry.argtypes = argtypes
        entry.restype = None
        entries[dtype] = entry
    return entries


def entry_address(library: Path, name: str) -> int:
    """The address of `library`'s extern "C" entry `name` (the library loaded once per process:
    a second CDLL of the same path shares the first's handle)."""
    address = ctypes.cast(getattr(ctypes.CDLL(str(library)), name), ctypes.c_void_p).value
    assert address is not None
    return address


class NativeRows:
    """A GatheredKernel: the C kernel where its preconditions hold, `fallback` elsewhere."""

    def __init__(self, library: Path, fallback: GatheredKernel | None = None):
        self._entries = load_entries(library, _ENTRIES, _ARGTYPES)
        # runs in tiles (lora_runs.h): bf16 where the CPU has AVX512-BF16 or AVX2 + FMA
        lib = ctypes.CDLL(str(library))
        self._runs = lib.lora_runs_bf16 if lib.lora_runs_available() else None
        if self._runs is not None:
            self._runs.argtypes, self._runs.restype = _RUNS_ARGTYPES, None
        self._fallback = fallback
        self._subs: dict[tuple[tuple[int, int], ...], torch.Tensor] = {}
        self.library = library

    def fallback(self) -> GatheredKernel:
        return self._fallback if self._fallback is not None else compiled_gathered_rows()

    @property
    def runs_bf16(self) -> bool:
        """Whether `run_segments` takes bf16 calls here (the CPU has AVX512-BF16 or AVX2 +
        FMA)."""
        return self._runs is not None

    def runs_natively(self, x: torch.Tensor, out: torch.Tensor, lora_a: torch.Tensor,
                      lora_b_rows: torch.Tensor) -> bool:  # fmt: skip
        return (
            lora_a.shape[1] <= MAX_FUSED_RANK  # n * rank: the stacks' fused rank rows
            and x.dtype in self._entries
            and x.dtype == out.dtype == lora_a.dtype == lora_b_rows.dtype
            and x.device.type == "cpu"
            and x.dim() == out.dim() == 2
            and x.stride(1) == 1
            and out.stride(1) == 1
            and lora_a.is_contiguous()
            and lora_b_rows.is_contiguous()
        )

    def run_segments(
        self,
        x: torch.Tensor,
        out: torch.Tensor,
        segments: torch.Tensor,
        lora_a: torch.Tensor,
        lora_b_rows: torch.Tensor,
        slot_ranks: torch.Tensor,
        subs: tuple[tuple[int, int], ...],
        rank: int,
    ) -> bool:
        """Every run of `segments` ([K, 3] int64 (start, end, slot), rows consecutive) in one
        call of the tiled kernel, long runs and short alike; False (nothing done) where that
        kernel does not take the call (not bf16, neither AVX512-BF16 nor AVX2 + FMA, another
        layout): the caller then runs long runs by matmuls and short ones by `__call__`."""
        if (
            self._runs is None
            or x.dtype is not torch.bfloat16
            or not self.runs_natively(x, out, lora_a, lora_b_rows)
        ):
            return False
        slot_ranks = slot_ranks.to(torch.int32).contiguous()
        self._runs(
            x.data_ptr(),
            x.stride(0),
            out.data_ptr(),
            out.stride(0),
            segments.data_ptr(),
            segments.shape[0],
            lora_a.data_ptr(),
            lora_a.shape[2],
            lora_b_rows.data_ptr(),
            lora_b_rows.shape[2],
            slot_ranks.data_ptr(),
            self._sub_table(subs).data_ptr(),
            len(subs),
            rank,
            torch.get_num_threads(),
        )
        return True

    def _sub_table(self, subs: tuple[tuple[int, int], ...]) -> torch.Tensor:
        table = self._subs.get(subs)
        if table is None:  # a handful of distinct tuples per model: kept
            table = self._subs[subs] = torch.tensor(subs, dtype=torch.int64).reshape(-1)
        return table

    def __call__(
        self,
        x: torch.Tensor,
        out: torch.Tensor,
        rows: torch.Tensor,
        slots: torch.Tensor,
        lora_a: torch.Tensor,
        lora_b_rows: torch.Tensor,
        slot_ranks: torch.Tensor,
        subs: tuple[tuple[int, int], ...],
        rank: int,
    ) -> None:
        if not self.runs_natively(x, out, lora_a, lora_b_rows):
            self.fallback()(x, out, rows, slots, lora_a, lora_b_rows, slot_ranks, subs, rank)
            return
        table = self._sub_table(subs)
        # the index tensors come from kernels/cpu/plan.py (int64) and LoRAKernelMeta (int32)
        rows, slots = rows.contiguous(), slots.contiguous()
        slot_ranks = slot_ranks.to(torch.int32).contiguous()
        self._entries[x.dtype](
            x.data_ptr(),
            x.stride(0),
            out.data_ptr(),
            out.stride(0),
            rows.data_ptr(),
            slots.data_ptr(),
            rows.numel(),
            lora_a.data_ptr(),
            lora_a.shape[2],
            lora_b_rows.data_ptr(),
            lora_b_rows.shape[2],
            slot_ranks.data_ptr(),
            table.data_ptr(),
            len(subs),
            rank,
            torch.get_num_threads(),
        )


@functools.cache
def native_rows() -> NativeRows:
    """The C kernel, built on first call (well under a second with gcc -O3). Raises
    NativeBuildError where it cannot be built; not cached then, so callers keep their choice."""
    return NativeRows(build())


@functools.cache
def default_rows_kernel() -> GatheredKernel:
    """What `kernels.cpu.reference.lora_add_cpu` runs when not told: the C kernel, else inductor's."""
    try:
        return native_rows()
    except NativeBuildError:
        return compiled_gathered_rows()
