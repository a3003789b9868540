"""The engine's one entry to LoRA: the adapter registry, the cache policy over the slots, and
the per-step batch metadata. Runs on the engine loop thread, except `read`, which is pure
(validation and disk reads): the server runs it on a worker thread for the load endpoint, and
the cache's reads run it on the manager's own reader thread (`start_load`), so a request whose
adapter must come from disk never stalls the sequences stepping beside it."""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass
from functools import partial

import torch

from lora.batch import NO_SLOT, LoRABatch, build_lora_batch
from lora.cache import AdapterCache, Tier
from lora.dims import BaseModelDims
from lora.errors import AdapterConflictError, AdapterNotFoundError
from lora.layers import LoRALayers
from lora.loader import LoadedAdapter, LoaderLimits, load_adapter
from lora.registry import AdapterId, AdapterRecord, AdapterRegistry, check_adapter_name


@dataclass(frozen=True)
class AdapterInfo:
    name: str
    path: str
    rank: int
    tier: Tier
    base_model_name: str | None


def read_adapter(
    path: str, *, dims: BaseModelDims, limits: LoaderLimits, dtype: torch.dtype, pin: bool
) -> LoadedAdapter:
    """Read, check, and convert to the slots' dtype here, on the reader thread: activating a slot
    on the engine loop is then a plain copy (converting 5 MB of a rank-16 adapter there cost the
    loop a few ms per activation), and the CPU tier holds half the bytes in bf16."""
    adapter = load_adapter(path, dims, limits).to(dtype)
    return adapter.pin_memory() if pin else adapter


class LoRAManager:
    def __init__(
        self,
        layers: LoRALayers,
        dims: BaseModelDims,
        *,
        max_loras: int,
        max_cpu_loras: int,
        max_lora_rank: int,
        device: torch.device,
        base_model_name: str,
    ):
        self.layers = layers
        self.device = device
        self.max_rank = max_lora_rank
        self.base_model_name = base_model_name
        self.registry = AdapterRegistry()
        # Pinned CPU payloads let slot copies run asynchronously on CUDA.
        self.read: Callable[[str], LoadedAdapter] = partial(
            read_adapter,
            dims=dims,
            limits=LoaderLimits(max_lora_rank=max_lora_rank),
            dtype=layers.dtype,
            pin=device.type == "cuda",
        )
        # One reader: reads are mostly validation and copies, and a second thread would take
        # a core from the forward pass more often than it would hide a disk wait.
        self._reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lora-reader")
        self.cache: AdapterCache[LoadedAdapter] = AdapterCache(
            max_loras=max_loras, max_cpu_loras=max_cpu_loras, source=self
        )
        self._slot_ranks = [0] * max_loras

    def read_through(self, opener: Callable[[str], AbstractContextManager[str]]) -> None:
        """Read every adapter through `opener` from now on: fetched adapters live in a disk
        cache that may evict one the registry still names (lora/remote/fetched.py), and
        `opener` keeps it there, or fetches it again, while it is read."""
        plain = self.read

        def read(path: str) -> LoadedAdapter:
            with opener(path) as local:
                return plain(local)

        self.read = read

    def close(self) -> None:
        """Stop the reader thread; reads not started yet are dropped."""
        self._reader.shutdown(wait=False, cancel_futures=True)

    # -- AdapterSource (called by the cache) ---------------------------------------------

    def start_load(self, adapter_id: AdapterId) -> Future[LoadedAdapter]:
        # The path is looked up here, on the loop thread: the registry is not shared.
        return self._reader.submit(self.read, self.registry.by_id(adapter_id).path)

    def activate(self, slot: int, adapter_id: AdapterId, payload: LoadedAdapter) -> None:
        self.layers.set_slot(slot, payload)
        self._slot_ranks[slot] = payload.rank

    # -- control -------------------------------------------------------------------------

    def existing(self, name: str, path: str) -> AdapterRecord | None:
        """The record if `name` is loaded from `path` already; raises on a taken name."""
        check_adapter_name(name, base_model_name=self.base_model_name)
        record = self.registry.existing(name, path)
        if record is not None and self.cache.is_unloading(record.adapter_id):
            raise AdapterConflictError(
                f"adapter {name[:200]!r} is being unloaded; retry once it is gone",
                param="lora_name",
            )
        return record

    def add(
        self,
        name: str,
        path: str,
        adapter: LoadedAdapter | None = None,
        *,
        base_model_name: str | None = None,
    ) -> AdapterRecord:
        """Register an adapter (idempotent for the same name and path). `adapter` is the
        already-read payload; None reads it here."""
        record = self.existing(name, path)
        if record is not None:
            return record
        if adapter is None:
            adapter = self.read(path)
        record = self.registry.add(
            name, path, rank=adapter.rank, base_model_name=base_model_name or self.base_model_name
        )
        self.cache.register(record.adapter_id, adapter)
        return record

    def find(self, name: str) -> AdapterId | None:
        """The adapter a request's `model` names; None if unknown or being unloaded."""
        record = self.registry.get(name)
        if record is None or self.cache.is_unloading(record.adapter_id):
            return None
        return record.adapter_id

    def begin_unload(self, name: str) -> AdapterId:
        """New requests for it are refused from now on; it goes once no sequence uses it."""
        record = self.registry.get(name) if isinstance(name, str) else None
        if record is None:
            raise AdapterNotFoundError(
                f"adapter {str(name)[:200]!r} does not exist", param="lora_name"
            )
        self.cache.begin_unregister(record.adapter_id)
        return record.adapter_id

    def finish_unloads(self, live: Collection[AdapterId | None]) -> None:
        """Drop the adapters being unloaded that no live sequence (`live`: their adapters)
        uses any more."""
        for adapter_id in self.cache.finish_unregisters(live):
            self.registry.remove(adapter_id)

    @property
    def pending_unloads(self) -> frozenset[AdapterId]:
        return self.cache.unloading

    def describe(self) -> list[AdapterInfo]:
        return [
            AdapterInfo(r.name, r.path, r.rank, self.cache.tier(r.adapter_id), r.base_model_name)
            for r in self.registry.records()
            if not self.cache.is_unloading(r.adapter_id)
        ]

    # -- the step ------------------------------------------------------------------------

    def batch_for(
        self,
        adapter_ids: Sequence[AdapterId | None],
        num_tokens: Sequence[int],
        *,
        num_decodes: int,
    ) -> LoRABatch | None:
        """The step's metadata; every adapter here is acquired (holds a slot)."""
        slots = []
        for adapter_id in adapter_ids:
            if adapter_id is None:
                slots.append(NO_SLOT)
                continue
            slot = self.cache.slot_of(adapter_id)
            if slot is None:
                raise RuntimeError("a scheduled sequence's adapter holds no slot")
            slots.append(slot)
        return build_lora_batch(
            slots,
            num_tokens,
            num_decodes=num_decodes,
            slot_ranks=self._slot_ranks,
            max_rank=self.max_rank,
            max_fused=self.layers.max_fused,
            device=self.device,
        )
