"""Tenant tiers -> engine priority bands (lower value runs earlier, as in vLLM).

A request may ask for a priority inside its tier's band; anything outside is clamped into the
band, so a hint can never make a request more urgent than its tier allows.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tenancy.settings import TierBand


@dataclass(frozen=True)
class PriorityMapper:
    tiers: Mapping[str, TierBand]
    vllm_offset: int = 0

    def engine_priority(self, tier: str, hint: int | None = None) -> int:
        band = self.tiers[tier]
        if hint is None:
            return band.default
        return min(max(hint, band.lo), band.hi)

    def vllm_priority(self, engine_priority: int) -> int:
        """vLLM's priority scheduler also runs lower values first; its default is 0. The offset
        lets a deployment share a vLLM fleet with clients that use their own priorities."""
        return engine_priority + self.vllm_offset
