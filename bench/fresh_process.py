"""Run one benchmark cell in a process of its own.

In one long benchmark process, later loragate cells ran slower than the first for the same
work (bench/lora_throughput.py on the 2-core AMD EPYC: scale-1 at 533 tok/s three times in a
row, then 484-499 after one scale-1000 cell had run in the same process, with every earlier
engine garbage-collected), and best-of-N turned that drift into a bias for whichever cell ran
first. A fresh interpreter per cell starts each from the same state; the cell's clocks (wall
and the child's own CPU time) run inside the child, so start-up is not timed.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


def in_fresh_process(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """`fn(*args, **kwargs)` in a newly spawned process (not forked: the parent's OpenMP and
    torch state must not carry over); arguments and result travel pickled."""
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        return pool.submit(fn, *args, **kwargs).result()
