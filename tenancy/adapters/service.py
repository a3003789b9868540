"""Adapter storage: validate fully in memory, then write atomically under the adapter store.

Layout: <store>/<owner tenant id or "public">/<adapter id>/{adapter_config.json, ...}. Files are
written to a hidden temporary directory and renamed into place, so a failure leaves nothing.
"""

from __future__ import annotations

import os
import re
import shutil
import uuid
from pathlib import Path

from tenancy.adapters.archive import UploadedFile, collect_files
from tenancy.adapters.errors import AdapterRejected
from tenancy.adapters.validation import AdapterValidator, ValidatedAdapter
from tenancy.settings import TenancySettings

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


class AdapterService:
    def __init__(self, *, settings: TenancySettings, validator: AdapterValidator) -> None:
        self._root = Path(settings.adapter_store_dir)
        self._limits = settings.adapter_limits
        self._base_model_name = settings.base_model.name
        self._validator = validator

    def check_name(self, name: str) -> str:
        if len(name) > self._limits.max_name_length or not _NAME.fullmatch(name) or ".." in name:
            raise AdapterRejected(
                f"Adapter name must be 1-{self._limits.max_name_length} letters, digits, '.', '_'"
                " or '-', starting with a letter or digit.",
                param="name",
            )
        if name == self._base_model_name:
            # `model` picks the base model by this name first: such an adapter is unreachable,
            # and /v1/models would list the name twice.
            raise AdapterRejected("Adapter name is the base model's name.", param="name")
        return name

    def prepare(self, uploads: list[UploadedFile]) -> ValidatedAdapter:
        return self._validator.validate(collect_files(uploads, self._limits))

    def write(self, *, owner: str | None, adapter_id: str, adapter: ValidatedAdapter) -> Path:
        parent = self._root / (owner or "public")
        parent.mkdir(parents=True, exist_ok=True)
        final = parent / adapter_id
        tmp = parent / f".tmp-{uuid.uuid4().hex}"
        tmp.mkdir()
        try:
            for name, data in adapter.files.items():
                with open(tmp / name, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return final

    def remove(self, path: str | Path) -> None:
        target = Path(path).resolve()
        if self._root.resolve() in target.parents:
            shutil.rmtree(target, ignore_errors=True)

    def remove_owner(self, owner: str) -> None:
        """Every adapter file of one tenant (its directory, leftovers of failed writes too)."""
        target = (self._root / owner).resolve()
        if target.parent == self._root.resolve() and owner != "public":
            shutil.rmtree(target, ignore_errors=True)
