"""What the benchmark prints and records: the table, the machine and the software versions."""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from measurement import SystemResult


@dataclass(frozen=True)
class Row:
    workload: str
    system: str
    batch: str  # "64" or "max_num_seqs=64"
    num_requests: str  # "128" or "16 of 128" when subsampled
    tokens_per_s: float
    ratio: float  # vs the best transformers row of the same workload


def format_table(rows: Sequence[Row]) -> str:
    header = ("workload", "system", "batch", "requests", "tokens/s", "vs best HF")
    cells = [header] + [
        (
            r.workload,
            r.system,
            r.batch,
            r.num_requests,
            f"{r.tokens_per_s:.1f}",
            f"{r.ratio:.2f}x",
        )
        for r in rows
    ]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def machine_info() -> dict[str, Any]:
    model_name = platform.processor() or "unknown"
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                model_name = line.split(":", 1)[1].strip()
                break
    flags = _cpu_flags(cpuinfo)
    return {
        "cpu_model": model_name,
        "num_cpus": os.cpu_count(),
        "amx_bf16": "amx_bf16" in flags,
        "avx512_bf16": "avx512_bf16" in flags,
        "memory_gib": _memory_gib(),
        "platform": platform.platform(),
    }


def write_record(
    path: Path,
    record: dict[str, Any],
    args: Any,
    *,
    model_dir: Path,
    started: datetime.datetime,
    load_start: tuple[float, float, float],
    load_end: tuple[float, float, float],
) -> None:
    """Write a benchmark's JSON: its own `record` plus what every run records about itself
    (settings from `args`: quick, dtype, threads; the machine, its load, the versions)."""
    record = {
        **record,
        "quick": args.quick,
        "model": str(model_dir),
        "dtype": args.dtype,
        "threads": args.threads,
        "date": started.isoformat(timespec="seconds"),
        "machine": {
            **machine_info(),
            "load_average_start": load_start,
            "load_average_end": load_end,
        },
        "versions": versions(),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {path}")


def load_average() -> tuple[float, float, float]:
    # Other engineers run tests on this machine: a high load means noisy numbers.
    return os.getloadavg()


def versions() -> dict[str, str | bool]:
    import transformers

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "loragate_commit": _git(["rev-parse", "--short", "HEAD"]),
        # Uncommitted engine-side changes mean the commit alone does not say what was measured.
        "engine_uncommitted_changes": _git(
            # Top-level pathspecs: _git runs in bench/, where plain "engine" matched nothing.
            ["status", "--porcelain", "--", ":/engine", ":/kernels", ":/lora"]
        )
        != "",
    }


def _cpu_flags(cpuinfo: Path) -> set[str]:
    if not cpuinfo.exists():
        return set()
    for line in cpuinfo.read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def _memory_gib() -> float | None:
    meminfo = Path("/proc/meminfo")
    if not meminfo.exists():
        return None
    for line in meminfo.read_text().splitlines():
        if line.startswith("MemTotal:"):
            return round(int(line.split()[1]) / 2**20, 1)
    return None


def _git(args: list[str]) -> str:
    try:
        out = subprocess.run(
            ["git", *args],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return out.stdout.strip()


def warn_if_busy(load: float, threads: int) -> None:
    """A warning where other work was running when the benchmark started."""
    num_cpus = os.cpu_count() or 1
    if load <= 0.5:
        return
    print(f"warning: load average {load:.2f} on {num_cpus} CPUs: other work is running and the")
    print("  numbers will be noisy", end="")
    if threads > 1:
        print("; with --threads > 1 they can be several times slower", end="")
    print(flush=True)


def system_row(
    workload: str, result: SystemResult, best: SystemResult, batch: str, num_rounds: int = 1
) -> Row:
    """A system's result as a table row, its throughput also relative to `best`."""
    requests = str(result.num_requests)
    if result.is_subsampled:
        requests = f"first {result.num_requests} of {result.num_requests_total}"
    if result.batch_size > result.num_requests:
        batch = f"{batch} (holds all {result.num_requests})"
    if num_rounds > 1:
        requests = f"{requests} (median of {num_rounds})"
    return Row(
        workload,
        result.system,
        batch,
        requests,
        result.tokens_per_s,
        result.tokens_per_s / best.tokens_per_s,
    )
