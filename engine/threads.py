"""The engine's CPU threads: torch's intra-op pool, set once when an engine starts.

By default every core this process may run on (its affinity mask, which a container's cpuset or
`taskset` narrows), not torch's own default, which counts the machine's physical cores whether
or not this process may use them.
"""

from __future__ import annotations

import os

import torch


def available_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def apply_threads(requested: int | None) -> int:
    """Set torch's intra-op threads (None: every available core); returns the count used."""
    num_threads = requested if requested is not None else available_cores()
    torch.set_num_threads(num_threads)
    return num_threads
