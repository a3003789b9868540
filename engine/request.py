"""A validated generate request as the engine receives it (wire parsing lives in protocol.py)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NewType

from engine.sampling_params import SamplingParams

if TYPE_CHECKING:
    from engine.structured.matcher import CompiledGrammar

RequestId = NewType("RequestId", str)


@dataclass(frozen=True)
class EngineRequest:
    request_id: RequestId
    prompt_token_ids: tuple[int, ...]
    sampling_params: SamplingParams
    priority: int = 0
    cache_salt: str | None = None
    # Requests of equal priority share the engine fairly by this key; None falls back to the salt.
    fairness_key: str | None = None
    # Name of a LoRA adapter (None: the base model); resolved by the engine, unknown -> 404.
    adapter_name: str | None = None
    arrival_time: float = field(default_factory=time.monotonic)
    # sampling_params.structured_outputs compiled (AsyncEngine.add_request does it off the
    # loop); None with a spec: the synchronous engine compiles it on admission.
    grammar: CompiledGrammar | None = field(default=None, compare=False, repr=False)

    @property
    def tenant_key(self) -> str:
        return self.fairness_key if self.fairness_key is not None else (self.cache_salt or "")
