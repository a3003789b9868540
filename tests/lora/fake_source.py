"""A tensor-free AdapterSource: payloads are strings, every read and slot fill is logged.

Reads finish at once unless `hold_loads` is set: then each stays pending until the test
completes it (`complete`, `complete_all`), the way a slow disk read on the worker thread would.
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field

from lora.errors import AdapterFormatError
from lora.registry import AdapterId


@dataclass
class FakeSource:
    loads: list[AdapterId] = field(default_factory=list)  # reads started, in order
    activations: list[tuple[int, AdapterId]] = field(default_factory=list)
    unreadable: set[AdapterId] = field(default_factory=set)
    # slot -> adapter whose weights the slot holds, as the tensors would
    slot_contents: dict[int, AdapterId] = field(default_factory=dict)
    hold_loads: bool = False
    pending: dict[AdapterId, Future[str]] = field(default_factory=dict)

    def start_load(self, adapter_id: AdapterId) -> Future[str]:
        self.loads.append(adapter_id)
        future: Future[str] = Future()
        if self.hold_loads:
            self.pending[adapter_id] = future
        else:
            self._finish(adapter_id, future)
        return future

    def complete(self, adapter_id: AdapterId) -> None:
        self._finish(adapter_id, self.pending.pop(adapter_id))

    def complete_all(self) -> None:
        for adapter_id in list(self.pending):
            self.complete(adapter_id)

    def _finish(self, adapter_id: AdapterId, future: Future[str]) -> None:
        if future.cancelled():
            return
        if adapter_id in self.unreadable:
            future.set_exception(AdapterFormatError(f"adapter {adapter_id} vanished from disk"))
        else:
            future.set_result(f"payload-{adapter_id}")

    def activate(self, slot: int, adapter_id: AdapterId, payload: str) -> None:
        assert payload == f"payload-{adapter_id}", "a slot got another adapter's payload"
        self.activations.append((slot, adapter_id))
        self.slot_contents[slot] = adapter_id
