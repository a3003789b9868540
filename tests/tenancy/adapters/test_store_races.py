"""An upload and a delete of the same content in flight together, on PostgreSQL (the fleet's
database: each replica its own transaction). Whichever goes first, the version that remains
names a blob that exists: the store's row locks make the other wait (tenancy/adapters/store.py).
Each test holds one transaction open, starts the other, waits until PostgreSQL shows that one
waiting on a lock, then lets the first commit."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, TypeVar

import pytest
from admin_harness import Harness, admin_harness
from sqlalchemy import delete, select, text
from sqlalchemy.ext.asyncio import AsyncSession

from gateway.demo.adapters import demo_adapter_files
from lora.adapter_format import bundle_sha256, make_bundle
from tenancy.settings import BaseModelSpec, TenancySettings
from tenancy.sql.models import Adapter, AdapterAlias, AdapterBlob

pytestmark = pytest.mark.postgres

T = TypeVar("T")
FILES = {f.filename: f.data for f in demo_adapter_files(BaseModelSpec(), seed=5)}
SHA = bundle_sha256(FILES)
LOCK_WAIT_LIMIT_S = 30.0  # a guard against a hang, not a timing assertion


@pytest.fixture(params=["database", "directory"])
async def harness(
    request: pytest.FixtureRequest,
    make_settings: Callable[..., TenancySettings],
    postgres_url: str,
) -> AsyncIterator[Harness]:
    settings = make_settings(database_url=postgres_url, adapter_store=request.param)
    async with admin_harness(settings) as h:
        yield h


async def _first_version(h: Harness) -> Adapter:
    tenant = (await h.call("POST", "/tenants", json={"name": "racer"})).json()["id"]
    multipart = [("files", (n, d)) for n, d in FILES.items()]
    r = await h.call("POST", f"/tenants/{tenant}/adapters", data={"name": "v"}, files=multipart)
    assert r.status_code == 201, r.text
    async with h.runtime.sessionmaker() as session:
        row = await session.get(Adapter, r.json()["id"])
        assert row is not None and row.sha256 == SHA
        session.expunge(row)
        return row


def _another_version(first: Adapter, storage_path: str | None) -> Adapter:
    """The row an upload of the same files under another name adds."""
    return Adapter(
        id=str(uuid.uuid4()), owner_tenant_id=first.owner_tenant_id, name="again", version=1,
        base_model=first.base_model, rank=first.rank, alpha=first.alpha,
        target_modules=first.target_modules, sha256=SHA, size_bytes=first.size_bytes,
        storage_path=storage_path, status="ready",
    )  # fmt: skip


async def _waiting_on_lock(h: Harness, task: asyncio.Task[T]) -> None:
    """Until another backend of this database waits on a lock (the task is blocked in it)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + LOCK_WAIT_LIMIT_S
    async with h.runtime.sessionmaker() as probe:
        while True:
            waiting = await probe.scalar(
                text(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND datname = current_database()"
                )
            )
            await probe.rollback()  # a fresh snapshot of pg_stat_activity next time
            if waiting:
                break
            assert not task.done(), "it went through without waiting for the lock"
            assert loop.time() < deadline, "nothing waited on the blob's lock"
            await asyncio.sleep(0.02)
    assert not task.done()


def _in_task(coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
    return asyncio.get_running_loop().create_task(coro)


async def _blob_served(h: Harness, adapter_id: str) -> None:
    async with h.runtime.sessionmaker() as session:
        assert await session.scalar(select(AdapterBlob.sha256).where(AdapterBlob.sha256 == SHA))
    stream = await h.runtime.adapters.open_bundle(h.runtime.sessionmaker, adapter_id)
    assert stream is not None, "the version names a blob whose bytes are gone"
    assert b"".join([chunk async for chunk in stream.chunks]) == make_bundle(FILES)


async def _delete(session: AsyncSession, first: Adapter) -> None:
    """What deleting the name's only version does before `release`: its alias, then the row."""
    await session.execute(delete(AdapterAlias).where(AdapterAlias.version_id == first.id))
    row = await session.get(Adapter, first.id)
    assert row is not None
    await session.delete(row)


async def test_an_upload_waits_for_a_delete_in_flight_and_stores_the_bytes_again(
    harness: Harness,
) -> None:
    h = harness
    store = h.runtime.adapters.store
    first = await _first_version(h)
    async with h.runtime.sessionmaker() as deleter, h.runtime.sessionmaker() as uploader:
        await _delete(deleter, first)
        aside = await store.release(deleter, SHA)  # the last version: its blob goes
        gone = await deleter.scalar(select(AdapterBlob.sha256).where(AdapterBlob.sha256 == SHA))
        assert gone is None
        upload = _in_task(store.put(uploader, FILES))
        await _waiting_on_lock(h, upload)
        await deleter.commit()
        h.runtime.adapters.remove(aside)  # the deleter's clean-up, after its commit
        stored = await upload
        again = _another_version(first, stored.storage_path)
        uploader.add(again)
        await uploader.commit()
    await _blob_served(h, again.id)


async def test_a_delete_waits_for_an_upload_in_flight_and_keeps_the_blob(
    harness: Harness,
) -> None:
    h = harness
    store = h.runtime.adapters.store
    first = await _first_version(h)
    async with h.runtime.sessionmaker() as deleter, h.runtime.sessionmaker() as uploader:
        stored = await store.put(uploader, FILES)  # the blob exists: held FOR SHARE
        again = _another_version(first, stored.storage_path)
        uploader.add(again)
        await uploader.flush()
        await _delete(deleter, first)
        release = _in_task(store.release(deleter, SHA))
        await _waiting_on_lock(h, release)
        await uploader.commit()
        assert await release == []  # it counted the new version: nothing to remove
        await deleter.commit()
    await _blob_served(h, again.id)
