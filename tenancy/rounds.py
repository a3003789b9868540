"""A background task that runs rounds of work: whenever woken, or every `interval_s`.

The usage ledger's writer, the budget-alert evaluator, the alert deliveries and the outage alerts
all work this way: requests note work synchronously (a dict or a deque, then `wake()`), and one
task per process does it in rounds, off the request path, one round at a time. A round that
fails goes to the owner's `on_failure` (which logs it in its own words, by the exception's type:
a message may quote data) and the next round retries; `pause_after_failure_s` keeps a down
database from turning into one warning per wake-up.

`close()` lets the round under way finish (cancelling it mid-transaction could lose a batch)
and returns once the task has ended; the owner then does its own last round if it needs one.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable


class RoundLoop:
    def __init__(
        self,
        work: Callable[[], Awaitable[object]],
        *,
        name: str,
        on_failure: Callable[[Exception], object],
        interval_s: float | None = None,
        pause_after_failure_s: float = 0.0,
    ) -> None:
        """`interval_s`: None runs a round only when woken."""
        self._work = work
        self._name = name
        self._on_failure = on_failure
        self._interval_s = interval_s
        self._pause_s = pause_after_failure_s
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False

    def wake(self) -> None:
        self._wake.set()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=self._name)

    async def _run(self) -> None:
        while not self._closing:
            if self._interval_s is None:
                await self._wake.wait()
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self._interval_s)
            self._wake.clear()
            try:
                await self._work()
            except Exception as exc:
                self._on_failure(exc)
                if self._pause_s:
                    await asyncio.sleep(self._pause_s)

    async def close(self) -> None:
        self._closing = True
        self._wake.set()
        if self._task is not None:
            with contextlib.suppress(Exception):
                await self._task
            self._task = None
