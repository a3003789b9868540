"""Adapter names -> records. Ids are never reused: a name unloaded and loaded again (maybe from
another path) gets a new id, so prefix-cache blocks keyed by the old id can never be hit by it."""

from __future__ import annotations

import itertools
import unicodedata
from dataclasses import dataclass
from typing import NewType

from lora.errors import AdapterConflictError, AdapterNameError

AdapterId = NewType("AdapterId", int)

MAX_NAME_LEN = 256


def check_adapter_name(name: object, *, base_model_name: str | None = None) -> str:
    """The name, or AdapterNameError: 1..256 printable characters, no path separators."""
    if not isinstance(name, str) or not name:
        raise AdapterNameError("lora_name must be a non-empty string", param="lora_name")
    if len(name) > MAX_NAME_LEN:
        raise AdapterNameError(
            f"lora_name is longer than {MAX_NAME_LEN} characters", param="lora_name"
        )
    if "/" in name or "\\" in name:
        raise AdapterNameError("lora_name must not contain path separators", param="lora_name")
    if (
        any(unicodedata.category(c)[0] in ("C", "Z") and c != " " for c in name)
        or name != name.strip()
    ):
        raise AdapterNameError(
            "lora_name must not contain control characters or leading/trailing spaces",
            param="lora_name",
        )
    if name in (".", ".."):
        raise AdapterNameError("lora_name must not be '.' or '..'", param="lora_name")
    if base_model_name is not None and name == base_model_name:
        raise AdapterNameError("lora_name is the base model's name", param="lora_name")
    return name


@dataclass(frozen=True)
class AdapterRecord:
    adapter_id: AdapterId
    name: str
    path: str
    rank: int
    base_model_name: str | None = None  # the parent listed in /v1/models


class AdapterRegistry:
    def __init__(self) -> None:
        self._by_name: dict[str, AdapterRecord] = {}
        self._by_id: dict[AdapterId, AdapterRecord] = {}
        self._ids = itertools.count(1)

    def __len__(self) -> int:
        return len(self._by_name)

    def records(self) -> list[AdapterRecord]:
        return list(self._by_name.values())

    def get(self, name: str) -> AdapterRecord | None:
        return self._by_name.get(name)

    def by_id(self, adapter_id: AdapterId) -> AdapterRecord:
        return self._by_id[adapter_id]

    def existing(self, name: str, path: str) -> AdapterRecord | None:
        """The record already holding `name` for `path` (a repeated load is idempotent), None
        if the name is free; AdapterConflictError if another path holds it."""
        record = self._by_name.get(name)
        if record is not None and record.path != path:
            raise AdapterConflictError(
                f"adapter {name[:200]!r} is already loaded from another path", param="lora_name"
            )
        return record

    def add(
        self, name: str, path: str, *, rank: int, base_model_name: str | None = None
    ) -> AdapterRecord:
        if self.existing(name, path) is not None:
            raise AdapterConflictError(
                f"adapter {name[:200]!r} is already loaded", param="lora_name"
            )
        record = AdapterRecord(AdapterId(next(self._ids)), name, path, rank, base_model_name)
        self._by_name[name] = record
        self._by_id[record.adapter_id] = record
        return record

    def remove(self, adapter_id: AdapterId) -> None:
        record = self._by_id.pop(adapter_id)
        del self._by_name[record.name]
