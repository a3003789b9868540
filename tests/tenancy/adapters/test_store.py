"""The content-addressed adapter store (tenancy/adapters/store.py), in both kinds: identical
files are stored once whoever uploads them, a blob goes with the last version naming it (or its
tenant), the directory store keeps `blobs/<sha256>/` and serves the same bundle bytes, and a
version stored before the blob store (its own directory, a weights-only hash) is adopted."""

from __future__ import annotations

import datetime as dt
import hashlib
import io
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from admin_harness import Harness, admin_harness
from sqlalchemy import func, select
from tenancy_factories import ADMIN_CTX

from gateway.demo.adapters import demo_adapter_files
from lora.adapter_format import bundle_sha256, make_bundle, read_bundle
from tenancy.crud.adapters import delete_adapter
from tenancy.crud.tenants import delete_tenant
from tenancy.settings import BaseModelSpec, TenancySettings
from tenancy.sql.models import Adapter, AdapterBlob

BASE = BaseModelSpec()  # the settings' default shapes: the demo adapters fit them


def _files(seed: int) -> dict[str, bytes]:
    return {f.filename: f.data for f in demo_adapter_files(BASE, seed=seed)}


async def _upload(h: Harness, tenant_id: str, name: str, files: dict[str, bytes]) -> Any:
    multipart = [("files", (n, d)) for n, d in files.items()]
    r = await h.call("POST", f"/tenants/{tenant_id}/adapters", data={"name": name}, files=multipart)
    assert r.status_code == 201, r.text
    return r.json()


async def _blobs(h: Harness) -> dict[str, bytes | None]:
    async with h.runtime.sessionmaker() as session:
        return {b.sha256: b.data for b in (await session.scalars(select(AdapterBlob))).all()}


async def _bundle(h: Harness, adapter_id: str) -> bytes:
    stream = await h.runtime.adapters.open_bundle(h.runtime.sessionmaker, adapter_id)
    assert stream is not None
    data = b"".join([chunk async for chunk in stream.chunks])
    assert len(data) == stream.size_bytes and hashlib.sha256(data).hexdigest() == stream.sha256
    return data


async def _tenant(h: Harness, name: str) -> str:
    return str((await h.call("POST", "/tenants", json={"name": name})).json()["id"])


@pytest.fixture(params=["database", "directory"])
async def store(
    request: pytest.FixtureRequest, make_settings: Callable[..., TenancySettings]
) -> AsyncIterator[Harness]:
    async with admin_harness(make_settings(adapter_store=request.param)) as harness:
        yield harness


async def test_identical_files_are_stored_once_and_go_with_the_last_version(
    store: Harness,
) -> None:
    h = store
    files = _files(seed=1)
    a, b = await _tenant(h, "a"), await _tenant(h, "b")
    first = await _upload(h, a, "same", files)
    second = await _upload(h, b, "also-same", files)
    other = await _upload(h, b, "other", _files(seed=2))
    sha = bundle_sha256(files)
    assert first["sha256"] == second["sha256"] == sha != other["sha256"]
    blobs = await _blobs(h)
    assert set(blobs) == {sha, other["sha256"]}
    assert await _bundle(h, first["id"]) == await _bundle(h, second["id"]) == make_bundle(files)
    kind = h.runtime.settings.adapter_store
    blob_dir = Path(h.runtime.settings.adapter_store_dir) / "blobs" / sha
    if kind == "database":
        assert blobs[sha] == make_bundle(files) and not blob_dir.exists()
    else:
        assert blobs[sha] is None
        assert {p.name: p.read_bytes() for p in blob_dir.iterdir()} == files
    async with h.runtime.sessionmaker() as session:
        await delete_adapter(
            session, ctx=ADMIN_CTX, service=h.runtime.adapters, tenant_id=a, adapter_id=first["id"]
        )
    assert sha in await _blobs(h)  # the other tenant's version still names it
    assert blob_dir.exists() == (kind == "directory")
    async with h.runtime.sessionmaker() as session:
        await delete_tenant(session, ctx=ADMIN_CTX, tenant_id=b, service=h.runtime.adapters)
    assert await _blobs(h) == {}  # its versions went by cascade, their blobs after them
    assert not blob_dir.exists()


async def test_a_version_from_before_the_store_is_adopted(
    make_settings: Callable[..., TenancySettings],
) -> None:
    settings = make_settings()
    files = _files(seed=3)
    legacy = Path(settings.adapter_store_dir) / "public" / "legacy-id"
    legacy.mkdir(parents=True)
    for name, data in files.items():
        (legacy / name).write_bytes(data)
    (legacy / "notes.txt").write_bytes(b"not part of the adapter")
    weights_sha = hashlib.sha256(files["adapter_model.safetensors"]).hexdigest()
    async with admin_harness(settings) as h:
        async with h.runtime.sessionmaker() as session:
            session.add(
                Adapter(
                    id="legacy-id", owner_tenant_id=None, name="old", base_model=BASE.name,
                    rank=8, alpha=16.0, target_modules=["q_proj"], sha256=weights_sha,
                    size_bytes=sum(map(len, files.values())), storage_path=str(legacy),
                    status="ready", created_at=dt.datetime.now(dt.UTC),
                )
            )  # fmt: skip
            await session.commit()
        assert await h.runtime.adapters.open_bundle(h.runtime.sessionmaker, "legacy-id") is None
        store = h.runtime.adapters.store
        assert await store.adopt_legacy(h.runtime.sessionmaker) == 1
        assert await store.adopt_legacy(h.runtime.sessionmaker) == 0  # once
        async with h.runtime.sessionmaker() as session:
            row = await session.get(Adapter, "legacy-id")
            assert row is not None and row.sha256 == bundle_sha256(files)
            assert await session.scalar(select(func.count(AdapterBlob.sha256))) == 1
        data = await _bundle(h, "legacy-id")
        assert read_bundle(io.BytesIO(data), max_bytes=len(data)) == files
        async with h.runtime.sessionmaker() as session:
            row = await session.get(Adapter, "legacy-id")
            assert row is not None
            await session.delete(row)
            gone = await h.runtime.adapters.release(
                session, sha256=row.sha256, storage_path=row.storage_path
            )
            await session.commit()
        assert gone == [legacy]  # its own directory, for the caller to remove after the commit
        assert await _blobs(h) == {}


async def _streams_in_slices(h: Harness) -> None:
    files = _files(seed=4)
    uploaded = await _upload(h, await _tenant(h, "t"), "sliced", files)
    stream = await h.runtime.adapters.open_bundle(h.runtime.sessionmaker, uploaded["id"])
    assert stream is not None
    chunks = [chunk async for chunk in stream.chunks]
    assert len(chunks) == -(-stream.size_bytes // 1000) > 2  # the last slice may be short
    assert b"".join(chunks) == make_bundle(files)


async def test_a_bundle_streams_from_sqlite_in_slices(
    make_settings: Callable[..., TenancySettings], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Slices of 1,000 bytes, one query each (`substr` on the BLOB), give the bundle back."""
    monkeypatch.setattr("tenancy.adapters.store.BUNDLE_CHUNK", 1000)
    async with admin_harness(make_settings()) as h:
        await _streams_in_slices(h)


@pytest.mark.postgres
async def test_a_bundle_streams_from_postgres_in_slices(
    make_settings: Callable[..., TenancySettings],
    monkeypatch: pytest.MonkeyPatch,
    postgres_url: str,
) -> None:
    """The same on PostgreSQL's bytea."""
    monkeypatch.setattr("tenancy.adapters.store.BUNDLE_CHUNK", 1000)
    async with admin_harness(make_settings(database_url=postgres_url)) as h:
        await _streams_in_slices(h)
