"""Concurrent loads of one key share one load.

When a cache entry expires under load, every request that misses it at once would otherwise
send the same query (32 connections: 32 identical queries per TTL). The load runs as a task of
its own, so one caller's cancellation never cancels it for the others; its result (or error)
goes to every caller waiting at the time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class SingleFlight(Generic[K, V]):
    def __init__(self) -> None:
        self._inflight: dict[K, asyncio.Task[V]] = {}

    async def run(self, key: K, load: Callable[[], Awaitable[V]]) -> V:
        task = self._inflight.get(key)
        if task is None:
            task = asyncio.ensure_future(load())
            self._inflight[key] = task
            task.add_done_callback(lambda done: self._forget(key, done))
        return await asyncio.shield(task)

    def _forget(self, key: K, done: asyncio.Task[V]) -> None:
        if self._inflight.get(key) is done:
            del self._inflight[key]
        if not done.cancelled():
            done.exception()  # every waiter may have left: the error is theirs, not the loop's
