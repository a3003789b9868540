"""Tenant tiers -> engine priority bands (lower value runs earlier, as in vLLM).

A request may ask for a priority inside its tier's band; anything outside is clamped into the
band, so a hint can never make a request more urgent than its tier allows.

The same tiers in the Gateway API Inference Extension's convention (an InferenceObjective's
`priority`: higher is more important, 0 is what a request without an objective gets, negative
is sheddable under saturation) come from `objective_priorities`; the Helm chart's objectives
are checked against it.
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

    def tier_of(self, engine_priority: int) -> str | None:
        """The tier whose band holds this priority (bands may overlap: the most urgent one, by
        default priority); None when no band does."""
        holding = [
            (band.default, name)
            for name, band in self.tiers.items()
            if band.lo <= engine_priority <= band.hi
        ]
        return min(holding)[1] if holding else None

    def vllm_priority(self, engine_priority: int) -> int:
        """vLLM's priority scheduler also runs lower values first; its default is 0. The offset
        lets a deployment share a vLLM fleet with clients that use their own priorities."""
        return engine_priority + self.vllm_offset


def objective_priorities(tiers: Mapping[str, TierBand], default_tier: str) -> dict[str, int]:
    """tier -> InferenceObjective priority. Tiers are ranked by their default engine priority
    (lower runs earlier); the default tier is 0, so a request without an objective is treated
    like one of its tenants; each more urgent rank is 1, 2, ...; each less urgent rank is -1,
    -2, ... and may be shed. Tiers with the same default share a priority."""
    if default_tier not in tiers:
        raise ValueError(f"default_tier {default_tier!r} is not one of the tiers")
    levels = sorted({band.default for band in tiers.values()})
    zero = levels.index(tiers[default_tier].default)
    return {name: zero - levels.index(band.default) for name, band in tiers.items()}
