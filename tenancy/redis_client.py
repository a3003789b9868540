"""One way to open Redis: a blocking pool, so bursts wait for a connection instead of failing."""

from __future__ import annotations

import redis.asyncio as aioredis


def make_redis(url: str, *, max_connections: int = 64, timeout_s: float = 5.0) -> aioredis.Redis:
    pool = aioredis.BlockingConnectionPool.from_url(
        url, max_connections=max_connections, timeout=timeout_s, socket_connect_timeout=timeout_s
    )
    return aioredis.Redis(connection_pool=pool)
