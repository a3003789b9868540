"""Handing one of the step's cores to a grammar compile, and back.

A compile thread running beside a step that uses every core takes CPU from one of the step's
OpenMP threads, and every barrier of the step then waits for that thread: the step already
running when a megabyte of schema began to compile took 240-290 ms against 9 ms
(bench/RESULTS.md, structured outputs). So the step runs on one thread fewer while a compile
holds a core, and a compile starts only once no step runs on every core: it waits for the step
in progress to end (one step's time; the request waits for its grammar anyway, holding no
batch slot), and the steps after it leave a core free. Where the engine has one thread there
is no core to hand over; the compile starts at once and relies on its lowered priority.

Plain Python, no torch: the engine applies the count `step_threads` returns.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class CoreHandoff:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._num_compiles = 0  # compiles waiting for a core or holding one
        self._full_step = False  # a step is running on every core

    @property
    def num_compiles(self) -> int:
        with self._cond:
            return self._num_compiles

    def step_threads(self, num_threads: int) -> int:
        """The threads the step about to run may use, of the engine's `num_threads`; the
        engine calls `step_done` when that step ends, however it ends."""
        with self._cond:
            if self._num_compiles and num_threads > 1:
                return num_threads - 1
            self._full_step = num_threads > 1
            return num_threads

    def step_done(self) -> None:
        with self._cond:
            self._full_step = False
            self._cond.notify_all()

    @contextmanager
    def core(self) -> Iterator[None]:
        """Held by a compile while it runs; entered once no step runs on every core."""
        with self._cond:
            self._num_compiles += 1
            self._cond.wait_for(lambda: not self._full_step)
        try:
            yield
        finally:
            with self._cond:
                self._num_compiles -= 1
