"""The hand-written CPU kernels' build: each source here (one per op family) compiled on first use
with the system's C++ compiler for this CPU (-march=native), cached on disk beside inductor's
artefacts, loaded through ctypes by its wrapper in kernels/cpu/.

Why on first use, not ahead of time per ISA level and chosen by CPU features at run time (ggml's
GGML_CPU_ALL_VARIANTS): loragate ships as Python source into a virtual environment, not as
wheels with binaries, and a machine that serves it has a compiler as often as not; one -march=native
build sees exactly the CPU it runs on (AMX, AVX512-BF16, AVX2 + FMA, or none, each source's
`#if`s picking its path) where variants would be a build matrix to keep and test. A build is a
few seconds once per machine; a restart finds it in the cache.

The cache key is everything the build reads: the source and every header it reaches through
`#include "..."` (derived from the files, never from a list kept by hand: a header left off a
list served a stale library), the compiler, the flags and the CPU's features.

Without a compiler no kernel builds: one warning says so and what runs instead (each caller's
PyTorch path: oneDNN matmuls, PyTorch attention and operators, the LoRA kernel eager), and every
build raises NoCompilerError, which `built_or_none` logs at info level only.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch

T = TypeVar("T")
log = logging.getLogger(__name__)

# -fno-trapping-math: without it GCC keeps every float select (a clamp, a sign test) a branch, and
# loops with one (the softmax's and SiLU's exp) stay scalar; the kernels read no FP exception
# flags, and no value changes.
FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c++17", "-fno-trapping-math")
# a quoted include at the start of a line; <...> headers are the compiler's, keyed by its path
_QUOTED_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"([^"]+)"', re.MULTILINE)


class NativeBuildError(RuntimeError):
    """No C++ compiler, or it failed: the caller's other path runs instead."""


class NoCompilerError(NativeBuildError):
    """No C++ compiler at all (already logged once, as a warning, by `compiler()`)."""


def built_or_none(make: Callable[[], T], what: str) -> T | None:
    """`make()` (a kernel built on first call), or None where it cannot be built, logged with
    `what` (the caller's fallback, e.g. "fused layer kernels unavailable; PyTorch operators
    instead"): a warning where the build failed, info where there is no compiler at all (the
    one warning for that came from `compiler()`)."""
    try:
        return make()
    except NoCompilerError as exc:
        log.info("%s (%s)", what, exc)
        return None
    except NativeBuildError as exc:
        log.warning("%s (%s)", what, exc)
        return None


def cache_root() -> Path:
    """Where inductor caches (TORCHINDUCTOR_CACHE_DIR, which the engine points at its
    compile_cache_dir, else inductor's default), so one directory holds every artefact."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    return Path(cache_dir())


def compiler() -> str:
    """The C++ compiler's path: CXX where set (a name looked up on PATH, or a path), else c++ or
    g++ on PATH. Raises NoCompilerError where there is none; the first time for each setting of
    CXX and PATH it logs the warning that says what that turns off."""
    cxx, path = os.environ.get("CXX") or None, os.environ.get("PATH")
    if cxx is not None:
        found = shutil.which(cxx, path=path)
        missing = f"CXX={cxx} is not an executable"
    else:
        found = shutil.which("c++", path=path) or shutil.which("g++", path=path)
        missing = "CXX unset, and neither c++ nor g++ on PATH"
    if found is None:
        _warn_no_compiler(missing)
        raise NoCompilerError(f"no C++ compiler: {missing}")
    return found


@functools.cache
def _warn_no_compiler(missing: str) -> None:
    """Once per cause: the one line an operator needs (each kernel's own fallback logs at info)."""
    log.warning(
        "no C++ compiler (%s): the native CPU kernels (kernels/cpu/native) are not built; the "
        "engine runs its PyTorch paths instead (oneDNN matmuls, PyTorch attention and "
        "operators, the LoRA kernel eager): correct, slower. Install g++ or set CXX.",
        missing,
    )


def included_headers(source: Path) -> tuple[Path, ...]:
    """Every header `source` reaches through `#include "..."`, transitively, sorted: each name
    resolved against the including file's directory, then `source`'s (the build's -I), as the
    compiler looks. Includes inside `#if`s count whether or not the build takes them (a key
    that changes too often costs a build; one that misses a header serves a stale library). A
    name found in neither directory is left to the compiler (a system header, or its error)."""
    found: set[Path] = set()
    pending = [source]
    while pending:
        current = pending.pop()
        for name in _QUOTED_INCLUDE.findall(current.read_text()):
            for directory in (current.parent, source.parent):
                header = (directory / name).resolve()
                if header.is_file():
                    if header not in found:
                        found.add(header)
                        pending.append(header)
                    break
    return tuple(sorted(found))


def _cpu_flags() -> str:
    """-march=native builds for this CPU: the cache key names its features."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.processor()


def cache_key(source: Path, compiler_path: str, flags: tuple[str, ...]) -> str:
    """16 hex digits over what the build of `source` reads and how: the texts of the source and
    of its headers (by name relative to the source's directory), the compiler, the flags, the
    machine and its CPU features."""
    parts = [source.read_text()]
    for header in included_headers(source):
        parts += [os.path.relpath(header, source.parent.resolve()), header.read_text()]
    parts += [compiler_path, *flags, platform.machine(), _cpu_flags()]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def build(
    cache_dir: Path | None = None, *, source: Path, extra_flags: tuple[str, ...] = ()
) -> Path:
    """The shared library for `source`, this compiler and CPU, compiled if not cached yet.
    extra_flags: appended to FLAGS (tests build the portable paths with -mno-avx512f)."""
    cxx = compiler()
    flags = (*FLAGS, *extra_flags)
    directory = (cache_dir or cache_root()) / "loragate_native"
    library = directory / f"{source.stem}-{cache_key(source, cxx, flags)}.so"
    if library.exists():
        return library
    directory.mkdir(parents=True, exist_ok=True)
    # built under a temporary name and renamed: processes building at once never load half a file
    fd, partial = tempfile.mkstemp(dir=directory, suffix=".so.partial")
    os.close(fd)
    try:
        result = subprocess.run(
            [cxx, *flags, f"-I{source.parent}", str(source), "-o", partial],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if result.returncode != 0:
            raise NativeBuildError(f"{cxx} failed: {result.stderr.strip()[-500:]}")
        os.replace(partial, library)
    except (OSError, subprocess.SubprocessError) as exc:
        raise NativeBuildError(f"{cxx}: {exc}") from exc
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
