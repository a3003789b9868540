"""The content-addressed adapter store: one `adapter_blobs` row per bundle hash
(lora/adapter_format/bundle.py), its bytes in the database (`database`, the default: every
gateway replica reaches them, no shared volume) or unpacked under the store directory
(`directory`: `<store>/blobs/<sha256>/`, the row's `data` NULL).

An adapter version's `sha256` names its blob; versions with equal files share one. A blob goes
when the last version naming it does (`release`, `collect_garbage`). Rows from before the store
(a directory per adapter, `sha256` over the weights alone) are adopted at start-up: their
bundle is hashed, a blob recorded for it and the row's `sha256` set to the bundle's, so every
ready version can be fetched by hash (`adopt_legacy`).

Uploads and deletes of the same content race across replicas (a tenant deletes the last version
of some files while another uploads them again). Row locks keep a version from ever naming a
blob that is gone: `put` holds the blob row it uses (FOR SHARE, or its own insert) until its
transaction ends, and `release` takes the row FOR UPDATE before it counts the versions naming
it, so it waits for an upload in flight and then sees its version; an upload that waited on a
delete finds the row gone and stores the bytes again. The directory store moves a released
blob's directory aside before the delete commits, so an upload that follows cannot have its
fresh copy removed by the deleter's clean-up. SQLite serializes writers and needs no locks (the
dialect drops FOR UPDATE).

Reads stream: from the database in CHUNK-sized slices (`substr`, one query each, so a bundle
is never held whole in memory), from a directory file by file.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from sqlalchemy import delete, func, select
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from lora.adapter_format import (
    BUNDLE_CHUNK,
    BUNDLE_END,
    BUNDLE_FILES,
    bundle_padding,
    bundle_sha256,
    make_bundle,
    member_header,
)
from tenancy.errors import DatabaseUnavailable
from tenancy.sql.models import Adapter, AdapterBlob

log = logging.getLogger(__name__)

StoreKind = Literal["database", "directory"]
BLOBS_DIR = "blobs"
# put's tries when its blob is deleted and stored again between its lock and its insert.
PUT_ATTEMPTS = 3


@dataclass(frozen=True)
class StoredBundle:
    sha256: str
    storage_path: str | None  # the directory store's directory; None in the database


@dataclass(frozen=True)
class BundleStream:
    """An adapter's bundle as the internal endpoint sends it."""

    sha256: str
    size_bytes: int
    chunks: AsyncIterator[bytes]


def read_dir_files(path: Path) -> dict[str, bytes]:
    """The bundle files of an adapter directory (anything else in it is not part of it)."""
    return {
        f.name: f.read_bytes()
        for f in sorted(path.iterdir())
        if f.name in BUNDLE_FILES and f.is_file()
    }


def _write_dir(final: Path, files: Mapping[str, bytes]) -> None:
    """Atomically: a hidden temporary directory renamed into place; an existing one (the
    same content, by its name) is kept."""
    if final.is_dir():
        return
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".tmp-{uuid.uuid4().hex}"
    tmp.mkdir()
    try:
        for name, data in files.items():
            with open(tmp / name, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        os.rename(tmp, final)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not final.is_dir():
            raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


class AdapterStore:
    def __init__(self, kind: StoreKind, root: Path) -> None:
        self.kind = kind
        self.root = root

    def blob_dir(self, sha256: str) -> Path:
        return self.root / BLOBS_DIR / sha256

    async def put(self, session: AsyncSession, files: Mapping[str, bytes]) -> StoredBundle:
        """Record the files' blob (once per content) in `session`'s transaction, which holds
        the blob row until it ends (see the module's note on races)."""
        data = make_bundle(files)
        sha = bundle_sha256(files)
        for _ in range(PUT_ATTEMPTS):
            if await _lock_blob(session, sha, for_delete=False):
                break
            try:
                async with session.begin_nested():
                    session.add(
                        AdapterBlob(
                            sha256=sha,
                            size_bytes=len(data),
                            data=data if self.kind == "database" else None,
                        )
                    )
                break
            except IntegrityError:
                continue  # another replica stored the same content a moment ago: lock that
        else:
            raise DatabaseUnavailable()  # inserted and deleted under us every time
        path = None
        if self.kind == "directory":  # after the row is ours: a delete cannot move it aside now
            path = self.blob_dir(sha)
            await asyncio.to_thread(_write_dir, path, files)
        return StoredBundle(sha256=sha, storage_path=None if path is None else str(path))

    async def release(self, session: AsyncSession, sha256: str) -> list[Path]:
        """Delete `sha256`'s blob if no version names it any more (call after deleting one, in
        the same transaction); the directories to remove once it commits."""
        await session.flush()
        if not await _lock_blob(session, sha256, for_delete=True):
            return []
        # A statement after the lock: on PostgreSQL it sees an upload that held the row.
        named = await session.scalar(select(func.count()).where(Adapter.sha256 == sha256))
        if named:
            return []
        await session.execute(delete(AdapterBlob).where(AdapterBlob.sha256 == sha256))
        return self._set_aside([sha256])

    async def collect_garbage(self, session: AsyncSession) -> list[Path]:
        """Delete every blob no version names (after a tenant's versions went by cascade). A
        blob an upload holds is skipped: its version is about to name it."""
        unnamed = AdapterBlob.sha256.not_in(select(Adapter.sha256))
        candidates = list(
            (
                await session.scalars(
                    select(AdapterBlob.sha256).where(unnamed).with_for_update(skip_locked=True)
                )
            ).all()
        )
        if not candidates:
            return []
        orphans = list(
            (
                await session.scalars(
                    delete(AdapterBlob)
                    .where(AdapterBlob.sha256.in_(candidates), unnamed)
                    .returning(AdapterBlob.sha256)
                )
            ).all()
        )
        gone = self._set_aside(orphans)
        await session.commit()
        return gone

    def _set_aside(self, shas: list[str]) -> list[Path]:
        """The directory store's blob directories renamed out of the way (before the delete
        commits, under the row lock): the paths to remove after it commits."""
        if self.kind != "directory":
            return []
        aside = []
        for sha in shas:
            target = self.root / BLOBS_DIR / f".released-{uuid.uuid4().hex}"
            try:
                os.rename(self.blob_dir(sha), target)
            except FileNotFoundError:
                continue
            aside.append(target)
        return aside

    async def open_bundle(
        self, sessionmaker: async_sessionmaker[AsyncSession], adapter_id: str
    ) -> BundleStream | None:
        """The bundle of one adapter version (None: no such version, or its bytes are gone)."""
        try:
            return await self._open_bundle(sessionmaker, adapter_id)
        except (OperationalError, DBAPIError) as exc:
            raise DatabaseUnavailable() from exc

    async def _open_bundle(
        self, sessionmaker: async_sessionmaker[AsyncSession], adapter_id: str
    ) -> BundleStream | None:
        async with sessionmaker() as session:
            row = await session.get(Adapter, adapter_id)
            if row is None or row.status != "ready":
                return None
            found = (
                await session.execute(
                    select(AdapterBlob.size_bytes, AdapterBlob.data.is_not(None)).where(
                        AdapterBlob.sha256 == row.sha256
                    )
                )
            ).first()
        if found is None:
            return None
        size, in_database = int(found[0]), bool(found[1])
        if in_database:
            chunks = _database_chunks(sessionmaker, row.sha256, size)
        elif row.storage_path is not None and Path(row.storage_path).is_dir():
            chunks = _directory_chunks(Path(row.storage_path))
        else:
            return None
        return BundleStream(sha256=row.sha256, size_bytes=size, chunks=chunks)

    async def adopt_legacy(self, sessionmaker: async_sessionmaker[AsyncSession]) -> int:
        """Give each version stored before the blob store its bundle's blob and hash; the
        number adopted. One that cannot be read is left as it is, with a warning."""
        async with sessionmaker() as session:
            rows = list(
                (
                    await session.scalars(
                        select(Adapter).where(
                            Adapter.sha256.not_in(select(AdapterBlob.sha256)),
                            Adapter.storage_path.is_not(None),
                        )
                    )
                ).all()
            )
            adopted = 0
            for row in rows:
                path = Path(row.storage_path or "")
                try:
                    files = await asyncio.to_thread(read_dir_files, path)
                except OSError as exc:
                    log.warning("adapter %s: its files cannot be read (%s)", row.id, exc.strerror)
                    continue
                data = make_bundle(files)
                sha = bundle_sha256(files)
                if not await _has_blob(session, sha):
                    in_db = data if self.kind == "database" else None
                    session.add(AdapterBlob(sha256=sha, size_bytes=len(data), data=in_db))
                row.sha256 = sha
                adopted += 1
            try:
                await session.commit()
            except IntegrityError:  # another replica adopted them at the same time
                await session.rollback()
                return 0
        return adopted


async def _lock_blob(session: AsyncSession, sha256: str, *, for_delete: bool) -> bool:
    """Whether the blob row exists, locked until the transaction ends: FOR UPDATE to delete
    it, else FOR SHARE (uploads of the same content do not wait for each other)."""
    found = await session.scalar(
        select(AdapterBlob.sha256)
        .where(AdapterBlob.sha256 == sha256)
        .with_for_update(read=not for_delete)
    )
    return found is not None


async def _has_blob(session: AsyncSession, sha256: str) -> bool:
    """Without loading its bytes."""
    found = await session.scalar(select(AdapterBlob.sha256).where(AdapterBlob.sha256 == sha256))
    return found is not None


async def _database_chunks(
    sessionmaker: async_sessionmaker[AsyncSession], sha256: str, size: int
) -> AsyncIterator[bytes]:
    async with sessionmaker() as session:
        for start in range(0, size, BUNDLE_CHUNK):
            piece = await session.scalar(
                select(func.substr(AdapterBlob.data, start + 1, BUNDLE_CHUNK)).where(
                    AdapterBlob.sha256 == sha256
                )
            )
            if not piece:
                return  # deleted meanwhile: the reader sees a short body and refuses it
            yield bytes(piece)


async def _directory_chunks(path: Path) -> AsyncIterator[bytes]:
    names = sorted(n for n in os.listdir(path) if n in BUNDLE_FILES)
    for name in names:
        file_path = path / name
        size = file_path.stat().st_size
        yield member_header(name, size)
        with open(file_path, "rb") as f:
            read: Callable[[int], bytes] = f.read
            while chunk := await asyncio.to_thread(read, BUNDLE_CHUNK):
                yield chunk
        yield bundle_padding(size)
    yield BUNDLE_END
