"""One gateway replica for the multi-process quota test: fires N concurrent admissions at once.

Prints a JSON line {"admitted": [reserved tokens...], "rejected": n} to stdout. A sixth argument
`cluster` makes the URL a Redis Cluster node's; `pipelined` uses the gateway's pipelined client
(tenancy/quota/pipelined.py) instead of redis-py's.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid

from tenancy.ids import RequestId
from tenancy.quota.pipelined import PipelinedRedis
from tenancy.quota.redis_store import RedisQuotaStore
from tenancy.quota.store import QuotaExceeded, QuotaLimits, QuotaSubject
from tenancy.redis_client import make_redis


async def main(redis_url: str, prefix: str, rpm: int, n: int, start_at: float, kind: str) -> None:
    client = (
        PipelinedRedis(redis_url)
        if kind == "pipelined"
        else make_redis(redis_url, cluster=kind == "cluster", max_connections=n)
    )
    store = RedisQuotaStore(client, prefix=prefix, lease_ttl_s=60)
    subject = QuotaSubject("t:shared", QuotaLimits(requests_per_minute=rpm))
    await client.ping()
    await asyncio.sleep(max(0.0, start_at - time.time()))

    async def one(i: int) -> int | None:
        rid = RequestId(f"{uuid.uuid4()}")
        try:
            await store.admit(request_id=rid, subjects=[subject], reserve_tokens=i + 1)
        except QuotaExceeded:
            return None
        return i + 1

    results = await asyncio.gather(*(one(i) for i in range(n)))
    admitted = [r for r in results if r is not None]
    print(json.dumps({"admitted": admitted, "rejected": n - len(admitted)}), flush=True)
    await store.close()


if __name__ == "__main__":
    url, prefix, rpm, n, start = sys.argv[1:6]
    kind = sys.argv[6] if len(sys.argv) > 6 else "redis-py"
    asyncio.run(main(url, prefix, int(rpm), int(n), float(start), kind))
