"""Start-up timings that pick a kernel by measuring it on this machine (engine/step/decode_backend.py,
engine/step/prefill_backend.py, engine/step/packed_linear.py)."""

from __future__ import annotations

import time
from collections.abc import Callable


def best_time(run: Callable[[], object], repeats: int) -> float:
    """Seconds of the fastest of `repeats` calls, after one untimed call (first calls allocate,
    and oneDNN builds its kernels)."""
    run()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best
