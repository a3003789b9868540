"""A second replica for the revocation test: verifies one key in a loop until it is refused.

Prints READY once the key is verified (and so cached), then REFUSED <unix time> when refused.
"""

from __future__ import annotations

import asyncio
import sys
import time

import redis.asyncio as aioredis

from tenancy.auth.key_format import KeyMinter
from tenancy.auth.key_verify import KeyCache, KeyVerifier
from tenancy.errors import InvalidApiKey
from tenancy.sql.session import make_engine, make_sessionmaker


async def main(db_url: str, redis_url: str, channel: str, pepper: str, key: str) -> None:
    engine = make_engine(db_url)
    client = aioredis.Redis.from_url(redis_url)
    verifier = KeyVerifier(
        minter=KeyMinter(prefix="lg", pepper=pepper.encode()),
        sessionmaker=make_sessionmaker(engine),
        cache=KeyCache(ttl_s=2.0),
        redis=client,
        channel=channel,
    )
    await verifier.start()
    await verifier.verify(key)
    print("READY", flush=True)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            await verifier.verify(key)
        except InvalidApiKey:
            print(f"REFUSED {time.time()}", flush=True)
            break
        await asyncio.sleep(0.01)
    await verifier.stop()
    await client.aclose()
    await engine.dispose()


if __name__ == "__main__":
    # The key arrives on stdin so it never sits in a process listing.
    args = sys.argv[1:5]
    asyncio.run(main(*args, sys.stdin.readline().strip()))
