"""SECURITY.md availability: Redis down fails closed with 503 and recovers by itself; the key
store on PostgreSQL never holds a clear key."""

from __future__ import annotations

import time
import uuid

import pytest
from services import KillableRedis
from sqlalchemy import text
from tenancy_factories import SecretRegistry, make_key, make_tenant

from tenancy.auth.key_format import KeyMinter
from tenancy.errors import ServiceUnavailable
from tenancy.ids import RequestId
from tenancy.quota.redis_store import RedisQuotaStore
from tenancy.quota.store import QuotaLimits, QuotaSubject
from tenancy.redis_client import make_redis
from tenancy.sql.migrate import upgrade
from tenancy.sql.session import make_engine, make_sessionmaker


@pytest.mark.redis
async def test_redis_down_is_503_and_recovery_is_automatic(killable_redis: KillableRedis) -> None:
    client = make_redis(f"redis://127.0.0.1:{killable_redis.port}/0", timeout_s=0.5)
    store = RedisQuotaStore(client, prefix="lgtest:avail:", lease_ttl_s=30)
    subject = QuotaSubject("t:a", QuotaLimits(requests_per_minute=100))

    async def admit() -> None:
        await store.admit(
            request_id=RequestId(str(uuid.uuid4())), subjects=[subject], reserve_tokens=1
        )

    await admit()
    killable_redis.stop()
    with pytest.raises(ServiceUnavailable) as info:
        await admit()
    assert info.value.status_code == 503 and info.value.headers["retry-after"]
    killable_redis.start()  # a fresh, empty Redis: scripts must be reloaded too
    deadline = time.monotonic() + 5
    while True:
        try:
            await admit()
            break
        except ServiceUnavailable:
            assert time.monotonic() < deadline, "the store did not recover"
    await store.close()


@pytest.mark.postgres
async def test_no_clear_key_in_a_postgres_dump(
    postgres_url: str, secret_registry: SecretRegistry
) -> None:
    engine = make_engine(postgres_url)
    await upgrade(engine)
    minter = KeyMinter(prefix="lg", pepper=b"pepper-for-the-postgres-dump-test")
    async with make_sessionmaker(engine)() as session:
        tenant = await make_tenant(session)
        keys = [
            secret_registry.add((await make_key(session, minter, tenant.id)).key) for _ in range(3)
        ]
    dump: list[str] = []
    async with engine.connect() as conn:
        for table in (
            "tenants",
            "api_keys",
            "quota_policies",
            "adapters",
            "usage_records",
            "audit_events",
        ):
            rows = await conn.execute(text(f"SELECT t::text FROM {table} t"))
            dump += [r[0] for r in rows]
    await engine.dispose()
    text_dump = "\n".join(dump)
    assert len(dump) >= 1 + 3 + 4  # tenant, keys, audit events
    for key in keys:
        assert key not in text_dump and key[3:-6] not in text_dump and key[-10:] not in text_dump
