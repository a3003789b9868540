"""How busy other processes keep this process's cores: measured once before the start-up
timings, so a timing taken on a loaded machine says so (its figures, and a warning that names
`--tune`), instead of silently saving a choice the load may have made.

The load average would not do: it lags by a minute (a job started seconds before the engine
hardly shows) and counts the whole machine, not the cores this process may run on.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

# /proc/stat's per-CPU fields that are time spent running something (idle and iowait are not;
# guest time is already in user)
_BUSY_FIELDS = (0, 1, 2, 5, 6, 7)  # user nice system irq softirq steal


def others_busy_cores(window_s: float = 0.25, stat: Path = Path("/proc/stat")) -> float | None:
    """Cores of this process's CPU set that other processes kept busy over `window_s` (0: a
    quiet machine; 2.0: two cores' worth), or None where the platform does not say (not Linux).
    """
    if not hasattr(os, "sched_getaffinity"):
        return None
    cpus = os.sched_getaffinity(0)
    before, own_before, start = _busy_ticks(stat, cpus), _own_seconds(), time.monotonic()
    if before is None:
        return None
    time.sleep(window_s)
    after, own_after, elapsed = _busy_ticks(stat, cpus), _own_seconds(), time.monotonic() - start
    if after is None:
        return None
    busy_s = (after - before) / os.sysconf("SC_CLK_TCK")
    return max(0.0, (busy_s - (own_after - own_before)) / elapsed)


def _busy_ticks(stat: Path, cpus: set[int]) -> int | None:
    try:
        lines = stat.read_text().splitlines()
    except OSError:
        return None
    total = 0
    for line in lines:
        name, *fields = line.split()
        if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus:
            total += sum(int(fields[i]) for i in _BUSY_FIELDS if i < len(fields))
    return total


def _own_seconds() -> float:
    times = os.times()
    return times.user + times.system
