"""The ledger's batch write (tenancy/crud/usage.py, with COPY on PostgreSQL:
tenancy/crud/usage_copy.py): every field round-trips, a batch holding a request id already in the
ledger still writes the others exactly once, on both databases."""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator, Callable

import pytest
from services import create_database, drop_database
from sqlalchemy import select

from tenancy.crud.usage import UsageIn, record_usage_batch
from tenancy.crud.usage_copy import can_copy
from tenancy.ids import ApiKeyId, RequestId, TenantId
from tenancy.runtime import build_runtime
from tenancy.settings import TenancySettings
from tenancy.sql.migrate import upgrade
from tenancy.sql.models import UsageRecord

START = dt.datetime(2026, 11, 29, 23, 59, 30, 123456, tzinfo=dt.UTC)


def _record(i: int) -> UsageIn:
    return UsageIn(
        request_id=RequestId(f"req-{i}"),
        tenant_id=TenantId("tenant-a"),
        api_key_id=ApiKeyId("key-a") if i % 2 else None,
        model="tiny",
        adapter_id="adapter-1" if i % 3 == 0 else None,
        prompt_tokens=10 + i,
        completion_tokens=i,
        cached_tokens=i // 2,
        finish_reason="length" if i % 2 else "stop",
        started_at=START + dt.timedelta(seconds=i),
        finished_at=START + dt.timedelta(seconds=i, milliseconds=500),  # crosses midnight
        cost_micros=1000 * i,
        adapter_version=3 if i % 3 == 0 else None,
    )


@pytest.fixture(params=["sqlite", "postgres"])
async def database_url(request: pytest.FixtureRequest) -> AsyncIterator[str | None]:
    """None: make_settings' SQLite file; else a fresh PostgreSQL database."""
    if request.param == "sqlite":
        yield None
        return
    server = request.getfixturevalue("postgres_server_url")
    url = await create_database(server)
    yield url
    await drop_database(server, url)


async def test_batches_round_trip_and_stay_exactly_once(
    database_url: str | None, make_settings: Callable[..., TenancySettings]
) -> None:
    overrides = {"database_url": database_url} if database_url else {}
    runtime = await build_runtime(make_settings(**overrides))
    try:
        await upgrade(runtime.engine)
        first = [_record(i) for i in range(40)]
        async with runtime.sessionmaker() as session:
            assert can_copy(session) == (database_url is not None)
            assert await record_usage_batch(session, records=first) == 40
        # A retried settlement's row (req-5, req-39) among new ones: the batch fails as one,
        # then goes row by row; the old rows stay single, the new ones are written.
        again = [_record(5), *(_record(i) for i in range(40, 60)), _record(39)]
        async with runtime.sessionmaker() as session:
            assert await record_usage_batch(session, records=again) == 20
        async with runtime.sessionmaker() as session:
            rows = (await session.scalars(select(UsageRecord))).all()
        assert sorted(r.request_id for r in rows) == sorted(f"req-{i}" for i in range(60))
        by_id = {r.request_id: r for r in rows}
        for i in (0, 1, 3, 59):
            want, got = _record(i), by_id[f"req-{i}"]
            for field in vars(want):
                assert getattr(got, field) == getattr(want, field), (i, field)
            assert got.day == want.finished_at.date()
            assert len(got.id) == 36
    finally:
        await runtime.close()
