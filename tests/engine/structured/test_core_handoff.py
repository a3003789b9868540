"""The core a grammar compile takes from the step (engine/structured/core_handoff.py), without a
model: a compile waits for a step that runs on every core to end, the steps while it holds its
core run on one thread fewer, and all of them come back when it ends."""

from __future__ import annotations

import threading

from engine.structured.core_handoff import CoreHandoff


def _compile_in_thread(
    cores: CoreHandoff, leave: threading.Event
) -> tuple[threading.Thread, threading.Event]:
    entered = threading.Event()

    def run() -> None:
        with cores.core():
            entered.set()
            leave.wait(timeout=30)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, entered


def test_a_compile_waits_for_the_step_on_every_core_then_the_steps_leave_it_a_core() -> None:
    cores, leave = CoreHandoff(), threading.Event()
    assert cores.step_threads(4) == 4  # a step on every core is running
    thread, entered = _compile_in_thread(cores, leave)
    assert not entered.wait(timeout=0.3), "the compile started beside a step on every core"
    assert cores.num_compiles == 1
    cores.step_done()
    assert entered.wait(timeout=10)
    # while it holds its core, every step runs on one thread fewer
    for _ in range(3):
        assert cores.step_threads(4) == 3
        cores.step_done()
    leave.set()
    thread.join(timeout=10)
    assert cores.num_compiles == 0
    assert cores.step_threads(4) == 4


def test_a_compile_asked_between_steps_starts_at_once_and_the_next_step_yields() -> None:
    cores, leave = CoreHandoff(), threading.Event()
    thread, entered = _compile_in_thread(cores, leave)
    assert entered.wait(timeout=10)
    assert cores.step_threads(2) == 1
    # a second compile beside a step on fewer cores does not wait either
    second, second_entered = _compile_in_thread(cores, leave)
    assert second_entered.wait(timeout=10)
    assert cores.num_compiles == 2
    cores.step_done()
    leave.set()
    thread.join(timeout=10)
    second.join(timeout=10)
    assert cores.num_compiles == 0


def test_a_one_thread_engine_has_no_core_to_hand_over_and_does_not_hold_compiles() -> None:
    cores, leave = CoreHandoff(), threading.Event()
    assert cores.step_threads(1) == 1
    thread, entered = _compile_in_thread(cores, leave)
    assert entered.wait(timeout=10), "a one-thread step held the compile back"
    assert cores.step_threads(1) == 1
    cores.step_done()
    leave.set()
    thread.join(timeout=10)
