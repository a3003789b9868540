"""The usage ledger writer: one record per request, written in batches off the request path.

Records wait in memory at most `flush_interval_s` (or until `batch_size` are pending) and are
written in one transaction. A database outage keeps them pending and retries; past `max_pending`
the oldest are dropped and counted. `close()` flushes everything that is left (shutdown).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque

from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from tenancy.crud.usage import UsageIn, record_usage_batch

log = logging.getLogger(__name__)


class UsageWriter:
    def __init__(
        self,
        sessionmaker: async_sessionmaker[AsyncSession],
        *,
        flush_interval_s: float,
        batch_size: int,
        max_pending: int,
    ) -> None:
        self._sessionmaker = sessionmaker
        self._flush_interval_s = flush_interval_s
        self._batch_size = batch_size
        self._max_pending = max_pending
        self._pending: deque[UsageIn] = deque()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self._closing = False
        self.num_written = 0
        self.num_dropped = 0

    @property
    def num_pending(self) -> int:
        return len(self._pending)

    def add(self, record: UsageIn) -> None:
        if len(self._pending) >= self._max_pending:
            self._pending.popleft()
            self.num_dropped += 1
            log.error("usage ledger backlog full; dropped the oldest record")
        self._pending.append(record)
        if len(self._pending) >= self._batch_size:
            self._wake.set()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="usage-writer")

    async def _run(self) -> None:
        while not self._closing:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._flush_interval_s)
            self._wake.clear()
            try:
                await self.flush()
            except Exception as exc:  # the records stay pending; the next round retries
                log.warning("usage ledger write failed (%s); retrying", type(exc).__name__)

    async def flush(self) -> None:
        """Write every pending record (in batches); raises if the database fails."""
        async with self._lock:
            while self._pending:
                size = min(self._batch_size, len(self._pending))
                batch = [self._pending.popleft() for _ in range(size)]
                try:
                    async with self._sessionmaker() as session:
                        self.num_written += await record_usage_batch(session, records=batch)
                except BaseException:
                    self._pending.extendleft(reversed(batch))  # back in front, in order
                    raise

    async def close(self) -> None:
        # Let a write in progress finish (cancelling it mid-transaction would lose the batch).
        self._closing = True
        self._wake.set()
        if self._task is not None:
            with contextlib.suppress(Exception):
                await self._task
            self._task = None
        try:
            await self.flush()
        except (OperationalError, DBAPIError, OSError) as exc:
            log.error(
                "usage ledger: %d records not written at shutdown (%s)",
                len(self._pending),
                type(exc).__name__,
            )
