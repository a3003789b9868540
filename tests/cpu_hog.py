"""A CPU hog: one process spinning on every core this process may use, for as long as a `with`
block runs. The tests of the engine's start-up choices (tests/engine/step/test_tuning.py) and
bench/start_under_load.py start engines beside it: a choice must not depend on what else runs.
The tests reach it by name (tests/conftest.py puts this folder on sys.path); the benchmark puts
tests/ on its path."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from engine.step.threads import available_cores


@contextmanager
def cpu_hog() -> Iterator[None]:
    """A process spinning on every core this process may use, killed on the way out."""
    hogs = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for _ in range(available_cores())
    ]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
        for hog in hogs:
            hog.wait()
