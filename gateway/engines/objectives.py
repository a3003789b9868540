"""Engines behind the Gateway API Inference Extension: every engine request names its tier's
InferenceObjective, so the extension's flow control orders requests by the tier's priority
(tenancy.priority.objective_priorities). The tier is found from the request's engine priority,
which policy clamped into the tier's band; names are `<LORAGATE_ENGINE_OBJECTIVE_PREFIX><tier>`,
the objects the Helm chart creates."""

from __future__ import annotations

from collections.abc import Callable

from gateway.settings import GatewaySettings
from tenancy.priority import PriorityMapper

# The extension reads a request's InferenceObjective from this header.
OBJECTIVE_HEADER = b"x-gateway-inference-objective"


def objectives(settings: GatewaySettings) -> Callable[[int], str | None] | None:
    """engine priority -> `<prefix><tier>` when the engines sit behind an inference gateway."""
    prefix = settings.engine_objective_prefix
    if prefix is None:
        return None
    mapper = PriorityMapper(settings.tiers)

    def objective(priority: int) -> str | None:
        tier = mapper.tier_of(priority)
        return None if tier is None else prefix + tier

    return objective


def objective_header(name: str | None) -> bytes:
    """The header line naming an InferenceObjective; none for a name that is not a plain token
    (tier names come from settings, never from clients)."""
    if name is None or not name.isascii() or not all(c.isalnum() or c in "-._" for c in name):
        return b""
    return OBJECTIVE_HEADER + b": " + name.encode() + b"\r\n"
