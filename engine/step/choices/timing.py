"""Start-up timings that pick a kernel by measuring it on this machine
(engine/step/decode_backend.py, prefill_backend.py, packed_linear.py, native_matmul.py). Taken
once per machine and model where the engine keeps a tuning file (engine/step/choices/tuning.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping


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


def best_times(runs: Mapping[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Seconds of each run's fastest of `repeats` calls, interleaved: each round calls every
    run once, in an order that rotates, so a busy spell of the machine slows all candidates
    alike rather than the one timed during it, and the best of many rounds finds each one's
    quiet moment. One untimed call each first, as `best_time`."""
    names = list(runs)
    for name in names:
        runs[name]()
    best = dict.fromkeys(names, float("inf"))
    for round_ in range(repeats):
        for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
            start = time.perf_counter()
            runs[name]()
            best[name] = min(best[name], time.perf_counter() - start)
    return best
