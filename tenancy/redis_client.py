"""One way to open Redis: a single server or a Redis Cluster, from the same URL setting.

A single server gets a blocking pool, so bursts wait for a connection instead of failing. Its
connections reconnect and resend a command that failed on a dead connection: after a Redis restart
every pooled connection to the old server is dead, and without the retry each one failed its next
command with a 503, one by one, minutes after Redis was back (issue 45). Only connection errors are
retried; a connection lost mid-reply on a live server can replay an admission, which the script
answers with the admission it already made (tenancy/quota/lua.py), counting nothing twice.
Settlement is idempotent.

A cluster client keeps a pool per node and follows slot moves; the quota store puts every key one
Lua script touches in one hash slot (tenancy/quota/redis_store.py), and the revocation channel uses
classic pub/sub, which a cluster delivers to subscribers on every node.
"""

from __future__ import annotations

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff

# What the quota store and the key verifier accept: the two clients share the commands they use.
RedisClient = aioredis.Redis | RedisCluster

CLUSTER_MAX_CONNECTIONS = 1024
# A dead connection reconnects and resends at once; a second failure means Redis is down, and
# the short backoff keeps a 503 prompt then.
RECONNECT_RETRIES = 2
RECONNECT_BACKOFF_S = (0.01, 0.1)  # (first, cap)


def make_redis(
    url: str, *, cluster: bool = False, max_connections: int = 64, timeout_s: float = 5.0
) -> RedisClient:
    if cluster:
        # A cluster node's pool does not wait for a free connection, it fails (a 503 at
        # admission), so each node gets room for a burst well past the single-server bound.
        return RedisCluster.from_url(
            url,
            max_connections=max(max_connections, CLUSTER_MAX_CONNECTIONS),
            socket_connect_timeout=timeout_s,
            socket_timeout=timeout_s,
        )
    pool = aioredis.BlockingConnectionPool.from_url(
        url,
        max_connections=max_connections,
        timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        retry=Retry(
            ExponentialBackoff(cap=RECONNECT_BACKOFF_S[1], base=RECONNECT_BACKOFF_S[0]),
            RECONNECT_RETRIES,
        ),
    )
    return aioredis.Redis(connection_pool=pool)
