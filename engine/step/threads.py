"""The engine's CPU threads: torch's intra-op pool, set once when an engine starts.

By default every core this process may run on (its affinity mask, which a container's cpuset or
`taskset` narrows), not torch's own default, which counts the machine's physical cores whether
or not this process may use them.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

import torch

_PR_SET_NAME = 15  # linux/prctl.h


def available_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def apply_threads(requested: int | None) -> int:
    """Set torch's intra-op threads (None: every available core); returns the count used."""
    num_threads = requested if requested is not None else available_cores()
    torch.set_num_threads(num_threads)
    return num_threads


def name_os_thread(name: str) -> None:
    """Give the calling thread `name` in the kernel's thread list (`top -H`, `ps -L`,
    /proc/PID/task/TID/comm; at most 15 bytes), as Python's thread names are not. Linux only;
    elsewhere, or if libc will not say, nothing happens."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        libc.prctl(_PR_SET_NAME, name.encode()[:15], 0, 0, 0)
    except (OSError, AttributeError):
        return
