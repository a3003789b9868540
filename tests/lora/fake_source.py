"""A tensor-free AdapterSource: payloads are strings, every load and slot fill is logged."""

from __future__ import annotations

from dataclasses import dataclass, field

from lora.errors import AdapterFormatError
from lora.registry import AdapterId


@dataclass
class FakeSource:
    loads: list[AdapterId] = field(default_factory=list)
    activations: list[tuple[int, AdapterId]] = field(default_factory=list)
    unreadable: set[AdapterId] = field(default_factory=set)
    # slot -> adapter whose weights the slot holds, as the tensors would
    slot_contents: dict[int, AdapterId] = field(default_factory=dict)

    def load(self, adapter_id: AdapterId) -> str:
        if adapter_id in self.unreadable:
            raise AdapterFormatError(f"adapter {adapter_id} vanished from disk")
        self.loads.append(adapter_id)
        return f"payload-{adapter_id}"

    def activate(self, slot: int, adapter_id: AdapterId, payload: str) -> None:
        assert payload == f"payload-{adapter_id}", "a slot got another adapter's payload"
        self.activations.append((slot, adapter_id))
        self.slot_contents[slot] = adapter_id
