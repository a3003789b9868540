"""The native kernels' build (kernels/cpu/native/build.py): its cache key follows the real
`#include` graph (a header a source reaches changes the library; one it does not reach leaves it),
the derived graph is what a grep of the sources (and the compiler's own dependency list) finds,
and a machine without a compiler gets one warning and a NoCompilerError from every build."""

from __future__ import annotations

import logging
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from kernels.cpu.native.build import (
    NoCompilerError,
    build,
    built_or_none,
    compiler,
    included_headers,
)

NATIVE = Path(__file__).parents[3] / "kernels" / "cpu" / "native"
SOURCES = sorted(NATIVE.glob("*.cpp"))


def _grep_closure(source: Path) -> set[Path]:
    """The headers `source` reaches, found by grep rather than by the build's parser."""
    found: set[Path] = set()
    pending = [source]
    while pending:
        lines = subprocess.run(
            ["grep", "-hE", r'^\s*#\s*include\s*"', str(pending.pop())],
            capture_output=True,
            text=True,
        ).stdout
        for name in re.findall(r'"([^"]+)"', lines):
            header = (source.parent / name).resolve()
            if header.is_file() and header not in found:
                found.add(header)
                pending.append(header)
    return found


def test_sources_exist() -> None:
    assert {s.name for s in SOURCES} >= {"rows.cpp", "matmul.cpp", "decoder.cpp"}


@pytest.mark.parametrize("source", SOURCES, ids=[s.name for s in SOURCES])
def test_the_derived_headers_are_what_a_grep_of_the_includes_finds(source: Path) -> None:
    derived = set(included_headers(source))
    assert derived == _grep_closure(source)
    assert derived, f"{source.name} includes headers of its own"
    # every header the compiler reads from this folder (its -MM list, #ifs taken) is keyed
    cxx = shutil.which("c++") or shutil.which("g++")
    if cxx is None:
        pytest.skip("no C++ compiler for the -MM check (the grep check above ran)")
    deps = subprocess.run(
        [cxx, "-MM", "-march=native", "-fopenmp", "-std=c++17", f"-I{NATIVE}", str(source)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    read = {
        (source.parent / token).resolve()
        for token in deps.replace("\\\n", " ").split()[1:]
        if token.endswith(".h")
    }
    assert read and read <= derived


def test_matmul_reaches_its_paths_headers() -> None:
    names = {h.name for h in included_headers(NATIVE / "matmul.cpp")}
    assert {"matmul_amx.h", "matmul_fma.h", "fma_tile.h", "steal.h", "bf16.h"} <= names
    assert "lora_runs.h" not in names


def test_a_header_the_source_reaches_changes_the_library(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """rows.cpp reaches lora_runs_fma.h through lora_runs.h (two levels down) and never
    steal.h: an edit of the first rebuilds, an edit of the second serves the same library."""
    if shutil.which("c++") is None and shutil.which("g++") is None:
        pytest.skip("no C++ compiler to build with")
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(NATIVE / "rows.cpp", src)
    for header in NATIVE.glob("*.h"):
        shutil.copy(header, src)
    source, cache = src / "rows.cpp", tmp_path / "cache"
    first = build(cache, source=source)

    with (src / "lora_runs_fma.h").open("a") as f:
        f.write("\n// an edit two includes down\n")
    second = build(cache, source=source)
    assert second != first and second.exists()  # rebuilt, the old library left as it was

    def no_compiler(*args: object, **kwargs: object) -> None:
        raise AssertionError("the compiler ran again")

    monkeypatch.setattr("kernels.cpu.native.build.subprocess.run", no_compiler)
    with (src / "steal.h").open("a") as f:
        f.write("\n// rows.cpp never includes this\n")
    assert build(cache, source=source) == second


def test_without_a_compiler_one_warning_and_every_build_refuses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.delenv("CXX", raising=False)
    caplog.set_level(logging.INFO, logger="kernels.cpu.native.build")
    for _ in range(3):
        with pytest.raises(NoCompilerError, match="neither c\\+\\+ nor g\\+\\+ on PATH"):
            build(tmp_path, source=NATIVE / "rows.cpp")
    assert built_or_none(lambda: compiler(), "the kernel unavailable; PyTorch instead") is None
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1
    assert "no C++ compiler" in warnings[0].message and "PyTorch" in warnings[0].message
    assert "the kernel unavailable; PyTorch instead" in caplog.text  # at info
    assert not (tmp_path / "loragate_native").exists()

    monkeypatch.setenv("CXX", str(tmp_path / "no-such-c++"))
    with pytest.raises(NoCompilerError, match="no-such-c"):
        compiler()
    assert sum(r.levelno >= logging.WARNING for r in caplog.records) == 2  # a new cause: named
