"""The tuning file: start-up choices timed once on a machine and saved, so that every later
start with the same CPU, model shapes, dtype, thread count and torch makes the same ones,
whatever else the machine is doing then.

Why: timed at every start, the choices followed the machine's load. Side by side, an engine
started while another process was busy chose the native matmul for 1-row steps only and ran at
0.98x vLLM; the same engine started on a quiet machine chose it for every step and ran at 1.57x;
another start under load chose SDPA for prefill attention. Saved, a slow choice made under load
is at least the same at every start, and `loragate engine --tune` on a quiet machine redoes it.

One JSON file holds an entry per key (the key's digest names it; the key is kept beside it,
readable, and must match):

    {"version": 1,
     "entries": {"3f2a...": {"key": {"cpu_model": "AMD EPYC ...", "num_threads": 2, ...},
                             "choices": {"decode_attention": {"value": "native",
                                                              "figures": "native 0.21 ms, ...",
                                                              "timed_at": "2026-11-29T..."}}}}}

The key names what a timing depends on: the CPU (its model name and the instruction sets the
kernels choose their paths by), the model's shapes and dtype, the thread count, and torch (its
oneDNN). A file that cannot be read, or holds another version's format, is ignored with a
warning (and replaced at the next save); a start never fails over it. A save rereads the file
under a lock and replaces it whole (a temporary file renamed over it), so engines starting at
once neither read half a file nor drop each other's entries.
"""

from __future__ import annotations

import dataclasses
import datetime
import fcntl
import hashlib
import json
import logging
import os
import platform
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from engine.models.hf_config import ModelConfig
from kernels.cpu.native.build import cache_root

log = logging.getLogger(__name__)

# Bumped when a saved value's meaning changes: entries of another version are ignored.
TUNING_VERSION = 1
FILE_NAME = "tuning.json"
# The instruction sets the kernels (kernels/cpu/native/*.cpp, oneDNN) choose their paths by; the
# rest of /proc/cpuinfo's flags (and their order) must not change the key.
KERNEL_FLAGS = frozenset({
    "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq",
    "avx512_bf16", "avx512_fp16", "avx512_vnni", "amx_tile", "amx_bf16", "amx_int8",
    "asimd", "sve", "sve2", "bf16", "i8mm",
})  # fmt: skip


@dataclass(frozen=True)
class TuningKey:
    """What a start-up timing depends on; two starts with equal keys make the same choices."""

    cpu_model: str
    cpu_flags: tuple[str, ...]  # sorted, of KERNEL_FLAGS
    machine: str  # x86_64, aarch64, ...
    torch_version: str
    num_threads: int
    dtype: str  # "bfloat16", "float32", ...
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int

    def as_json(self) -> dict[str, Any]:
        return json.loads(json.dumps(dataclasses.asdict(self)))  # the tuple as a list

    def digest(self) -> str:
        text = json.dumps(self.as_json(), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class TimedChoice:
    value: str  # as the chooser reads it back ("native", "sdpa", "every", "512", "yes")
    figures: str  # the timings behind it, for the start-up log
    timed_at: str  # ISO 8601, UTC
    # other processes kept the engine's cores busy while it was timed: it may be a slow choice
    under_load: bool = False

    @staticmethod
    def now(value: str, figures: str, *, under_load: bool = False) -> TimedChoice:
        stamp = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        return TimedChoice(value, figures, stamp, under_load)

    def is_well_formed(self) -> bool:
        """Each field of its type (a file edited by hand may hold anything)."""
        texts = (self.value, self.figures, self.timed_at)
        return all(isinstance(t, str) for t in texts) and isinstance(self.under_load, bool)


def tuning_key(
    model: ModelConfig, dtype: torch.dtype, num_threads: int, cpuinfo: Path = Path("/proc/cpuinfo")
) -> TuningKey:
    cpu_model, flags = _cpu(cpuinfo)
    return TuningKey(
        cpu_model=cpu_model,
        cpu_flags=tuple(sorted(flags & KERNEL_FLAGS)),
        machine=platform.machine(),
        torch_version=torch.__version__,
        num_threads=num_threads,
        dtype=str(dtype).removeprefix("torch."),
        hidden_size=model.hidden_size,
        intermediate_size=model.intermediate_size,
        num_layers=model.num_layers,
        num_heads=model.num_heads,
        num_kv_heads=model.num_kv_heads,
        head_dim=model.head_dim,
        vocab_size=model.vocab_size,
    )


def _cpu(cpuinfo: Path) -> tuple[str, frozenset[str]]:
    """The first processor's model name and flags (Linux's /proc/cpuinfo: `model name` and
    `flags` on x86, `Features` on ARM); the platform's processor string and none elsewhere."""
    name, flags = "", frozenset[str]()
    try:
        lines = cpuinfo.read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        field, _, value = line.partition(":")
        field = field.strip()
        if field in ("model name", "Model", "CPU part") and not name:
            name = value.strip()
        elif field in ("flags", "Features") and not flags:
            flags = frozenset(value.split())
    return name or platform.processor() or "unknown", flags


def default_tuning_file() -> Path:
    """Beside the native kernels' builds (engine option compile_cache_dir where set, else
    inductor's cache under the temporary directory)."""
    return cache_root() / "loragate_native" / FILE_NAME


def read_choices(path: Path, key: TuningKey) -> dict[str, TimedChoice]:
    """The choices saved in `path` for `key` (none where the file or the entry is missing). An
    unreadable or foreign file, or a malformed choice, is ignored with a warning."""
    entry = _entries(path).get(key.digest())
    if entry is None:
        return {}
    if not isinstance(entry, dict) or entry.get("key") != key.as_json():
        log.warning("tuning file %s: the entry for this machine and model is malformed; "
                    "timing again", path)  # fmt: skip
        return {}
    choices: dict[str, TimedChoice] = {}
    raw = entry.get("choices")
    for name, item in (raw if isinstance(raw, dict) else {}).items():
        try:
            choice = TimedChoice(**item)
        except TypeError:
            choice = None
        if choice is None or not choice.is_well_formed():
            log.warning("tuning file %s: choice %r is malformed; timing it again", path, name)
            continue
        choices[name] = choice
    return choices


def save_choices(path: Path, key: TuningKey, choices: Mapping[str, TimedChoice]) -> bool:
    """Merge `choices` into the entry for `key` in `path` (other entries, and the entry's other
    choices, kept); False, with a warning, where the file cannot be written."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path.with_name(path.name + ".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            entries = _entries(path, quiet=True)
            entry = entries.get(key.digest())
            saved = entry.get("choices") if isinstance(entry, dict) else None
            merged = {**(saved if isinstance(saved, dict) else {}), **{
                name: dataclasses.asdict(choice) for name, choice in choices.items()
            }}  # fmt: skip
            entries[key.digest()] = {"key": key.as_json(), "choices": merged}
            _write(path, {"version": TUNING_VERSION, "entries": entries})
    except OSError as exc:
        log.warning("tuning file %s not written (%s): the next start times again", path, exc)
        return False
    return True


def _entries(path: Path, *, quiet: bool = False) -> dict[str, Any]:
    """The file's entries; {} (with a warning, unless `quiet`) where it is missing, unreadable,
    or not this version's format."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        if not quiet:
            log.warning("tuning file %s unreadable (%s); ignored", path, exc)
        return {}
    entries = data.get("entries") if isinstance(data, dict) else None
    if (
        not isinstance(data, dict)
        or data.get("version") != TUNING_VERSION
        or not isinstance(entries, dict)
    ):
        if not quiet:
            log.warning("tuning file %s is not a version %d tuning file; ignored", path,
                        TUNING_VERSION)  # fmt: skip
        return {}
    return entries


def _write(path: Path, data: dict[str, Any]) -> None:
    fd, partial = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".partial")
    try:
        with os.fdopen(fd, "w") as out:
            json.dump(data, out, indent=1, sort_keys=True)
            out.write("\n")
        os.replace(partial, path)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
