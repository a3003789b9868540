"""Adapter uploads: validate fully in memory, then store the files once per content
(tenancy/adapters/store.py: the database or a directory, LORAGATE_ADAPTER_STORE), in the
transaction that records the version, so a failure leaves nothing.

Versions stored before the content-addressed store keep their own directory,
<store>/<owner tenant id or "public">/<adapter id>/, removed with them.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterable
from pathlib import Path

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from tenancy.adapters.archive import UploadedFile, collect_files
from tenancy.adapters.errors import AdapterRejected
from tenancy.adapters.store import BLOBS_DIR, AdapterStore, BundleStream, StoredBundle
from tenancy.adapters.validation import AdapterValidator, ValidatedAdapter
from tenancy.settings import BaseModelSpec, TenancySettings

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


class AdapterService:
    def __init__(self, *, settings: TenancySettings, validator: AdapterValidator) -> None:
        self._root = Path(settings.adapter_store_dir)
        self._limits = settings.adapter_limits
        # The primary base model first; more are registered as their pools start (a gateway
        # serving several, gateway/engines/pools.py). A name belongs to one base model.
        self.primary_base_model = settings.base_model.name
        self._validators: dict[str, AdapterValidator] = {self.primary_base_model: validator}
        self.store = AdapterStore(settings.adapter_store, self._root)

    def check_name(self, name: str) -> str:
        if len(name) > self._limits.max_name_length or not _NAME.fullmatch(name) or ".." in name:
            raise AdapterRejected(
                f"Adapter name must be 1-{self._limits.max_name_length} letters, digits, '.', '_'"
                " or '-', starting with a letter or digit.",
                param="name",
            )
        if name in self._validators:
            # `model` picks the base model by this name first: such an adapter is unreachable,
            # and /v1/models would list the name twice.
            raise AdapterRejected("Adapter name is the base model's name.", param="name")
        return name

    def serve_base_model(self, base: BaseModelSpec, validator: AdapterValidator) -> None:
        """Uploads may name `base.name` as their base model from now on."""
        self._validators[base.name] = validator

    @property
    def base_models(self) -> list[str]:
        return list(self._validators)

    def serving_model(self, recorded: str) -> str:
        """The base model a version serves on: the one its row records, or the primary for a
        name no longer served (rows from before a served model was renamed: they served on the
        one model then, and still do)."""
        return recorded if recorded in self._validators else self.primary_base_model

    def check_base_model(self, base_model: str | None) -> str:
        """The base model an upload names (None: the primary); 400 for one not served."""
        if base_model is None or base_model == "":
            return self.primary_base_model
        if base_model not in self._validators:
            served = ", ".join(repr(name[:200]) for name in self._validators)
            raise AdapterRejected(
                f"base_model {base_model[:200]!r} is not served here (served: {served}).",
                param="base_model",
            )
        return base_model

    def prepare(
        self, uploads: list[UploadedFile], base_model: str | None = None
    ) -> ValidatedAdapter:
        """Validated against the shapes of `base_model` (None: the primary)."""
        validator = self._validators[self.check_base_model(base_model)]
        return validator.validate(collect_files(uploads, self._limits))

    async def write(self, session: AsyncSession, *, adapter: ValidatedAdapter) -> StoredBundle:
        """Store the files (once per content) in `session`'s transaction: the version's row
        takes the returned hash and path."""
        return await self.store.put(session, adapter.files)

    async def release(
        self, session: AsyncSession, *, sha256: str, storage_path: str | None
    ) -> list[Path]:
        """After a version's row is deleted (same transaction): its blob goes if no other
        version shares it. The directories to `remove` once the transaction commits."""
        gone = await self.store.release(session, sha256)
        if storage_path is not None and BLOBS_DIR not in Path(storage_path).parts:
            gone.append(Path(storage_path))  # a version's own directory from before the store
        return gone

    async def collect_garbage(self, session: AsyncSession) -> None:
        """Blobs no version names any more (a tenant's went with it by cascade)."""
        self.remove(await self.store.collect_garbage(session))

    async def open_bundle(
        self, sessionmaker: async_sessionmaker[AsyncSession], adapter_id: str
    ) -> BundleStream | None:
        return await self.store.open_bundle(sessionmaker, adapter_id)

    def remove(self, paths: str | Path | Iterable[Path] | None) -> None:
        """Delete directories under the store (anything else is left alone)."""
        if paths is None:
            return
        for path in [Path(paths)] if isinstance(paths, (str, Path)) else paths:
            target = Path(path).resolve()
            if self._root.resolve() in target.parents:
                shutil.rmtree(target, ignore_errors=True)

    def remove_owner(self, owner: str) -> None:
        """Every adapter file of one tenant (its directory, leftovers of failed writes too)."""
        target = (self._root / owner).resolve()
        if target.parent == self._root.resolve() and owner != "public":
            shutil.rmtree(target, ignore_errors=True)
