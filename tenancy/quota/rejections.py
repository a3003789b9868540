"""Rejected inference requests per subject and reason, over the last hour (the dashboard's and
the quota-state API's "rejections by reason").

Counts live in one-minute buckets: a subject's last hour is the sum of its last 60 buckets, so a
read costs 60 small lookups at most and memory is bounded by subjects x 60 x reasons. The
in-process log counts this process's rejections (the embedded mode has one process); the Redis
log counts every gateway process's, in the same Redis as the quota store, so the page shows the
same numbers whichever replica serves it. Reasons are the gateway's bounded set of error codes,
never free text.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from typing import Protocol

from redis.exceptions import RedisError

from tenancy.errors import QuotaStoreUnavailable
from tenancy.redis_client import RedisClient

BUCKET_S = 60
NUM_BUCKETS = 60  # one hour
# Redis buckets outlive the hour by a minute, so a read at the edge still finds the oldest one.
_BUCKET_TTL_S = BUCKET_S * (NUM_BUCKETS + 1)


class RejectionLog(Protocol):
    async def record(self, subject_keys: tuple[str, ...], reason: str) -> None:
        """Count one rejection with `reason` for each subject ("t:<tenant>", "k:<key>")."""
        ...

    async def last_hour(self, subject_key: str) -> dict[str, int]:
        """reason -> rejections in the last hour (the current minute and the 59 before it)."""
        ...


def _minute(now: float) -> int:
    return int(now // BUCKET_S)


class InProcessRejectionLog:
    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        # subject -> [(minute, reasons)], oldest first, at most NUM_BUCKETS entries
        self._buckets: dict[str, deque[tuple[int, Counter[str]]]] = {}
        self._lock = threading.Lock()

    async def record(self, subject_keys: tuple[str, ...], reason: str) -> None:
        minute = _minute(self._clock())
        with self._lock:
            for key in subject_keys:
                buckets = self._buckets.setdefault(key, deque(maxlen=NUM_BUCKETS))
                if not buckets or buckets[-1][0] != minute:
                    buckets.append((minute, Counter()))
                buckets[-1][1][reason] += 1

    async def last_hour(self, subject_key: str) -> dict[str, int]:
        oldest = _minute(self._clock()) - NUM_BUCKETS + 1
        total: Counter[str] = Counter()
        with self._lock:
            for minute, reasons in self._buckets.get(subject_key, ()):
                if minute >= oldest:
                    total.update(reasons)
        return dict(total)


class RedisRejectionLog:
    """One hash per subject and minute: `<prefix>rj:{<subject>}:<minute>` reason -> count. The
    hash tag puts a subject's hour in one slot of a Redis Cluster (one node answers a read)."""

    def __init__(
        self,
        client: RedisClient,
        *,
        prefix: str,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._client = client
        self._prefix = prefix
        self._clock = clock

    def _key(self, subject_key: str, minute: int) -> str:
        return f"{self._prefix}rj:{{{subject_key}}}:{minute}"

    async def record(self, subject_keys: tuple[str, ...], reason: str) -> None:
        minute = _minute(self._clock())
        try:
            async with self._client.pipeline(transaction=False) as pipe:
                for key in subject_keys:
                    pipe.hincrby(self._key(key, minute), reason, 1)
                    pipe.expire(self._key(key, minute), _BUCKET_TTL_S)
                await pipe.execute()
        except (RedisError, OSError) as exc:
            raise QuotaStoreUnavailable() from exc

    async def last_hour(self, subject_key: str) -> dict[str, int]:
        newest = _minute(self._clock())
        try:
            async with self._client.pipeline(transaction=False) as pipe:
                for minute in range(newest - NUM_BUCKETS + 1, newest + 1):
                    pipe.hgetall(self._key(subject_key, minute))
                buckets = await pipe.execute()
        except (RedisError, OSError) as exc:
            raise QuotaStoreUnavailable() from exc
        total: Counter[str] = Counter()
        for bucket in buckets:
            for reason, count in bucket.items():
                total[reason.decode() if isinstance(reason, bytes) else str(reason)] += int(count)
        return dict(total)
