"""One gateway replica for the multi-process currency budget test: fires N concurrent admissions
at once against a shared daily spend budget, each reserving `cost` micro-units and settling them
in full (a request that used all it reserved).

Prints a JSON line {"admitted": n, "rejected": n, "limits": [names of the refusing limits]}.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid

from tenancy.ids import RequestId
from tenancy.quota.redis_store import RedisQuotaStore
from tenancy.quota.store import QuotaExceeded, QuotaLimits, QuotaSubject
from tenancy.redis_client import make_redis


async def main(
    redis_url: str, prefix: str, budget: int, cost: int, n: int, start_at: float
) -> None:
    client = make_redis(redis_url, max_connections=n)
    store = RedisQuotaStore(client, prefix=prefix, lease_ttl_s=60)
    subject = QuotaSubject("t:spender", QuotaLimits(daily_spend_budget_micros=budget))
    await client.ping()
    await asyncio.sleep(max(0.0, start_at - time.time()))

    async def one() -> str | None:
        try:
            admission = await store.admit(
                request_id=RequestId(str(uuid.uuid4())), subjects=[subject],
                reserve_tokens=10, reserve_micros=cost,
            )  # fmt: skip
        except QuotaExceeded as exc:
            return exc.limit.value
        await store.settle(admission, used_tokens=10, used_micros=cost)
        return None

    results = await asyncio.gather(*(one() for _ in range(n)))
    refused = [r for r in results if r is not None]
    print(json.dumps({"admitted": n - len(refused), "rejected": len(refused), "limits": refused}))
    await store.close()


if __name__ == "__main__":
    url, prefix, budget, cost, n, start = sys.argv[1:7]
    asyncio.run(main(url, prefix, int(budget), int(cost), int(n), float(start)))
