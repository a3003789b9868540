"""The pass-through job: a tokens-only body, parsed by the engine's own wire schema, checked
against the engine's rules, then every routing field set by policy.

A fresh engine request id (the client's id is restored in every answer, so tenants never share
an id space), the tenant's cache salt and fairness key, a priority clamped into its tier's band,
the adapter it may see, and no `kv_transfer_params` or `features`.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.protocol import GenerateRequest, InvalidRequestError, parse_generate_request
from gateway.lifecycle.job import EngineTarget, Plan, Planner, reserve_tokens
from gateway.passthrough.output import WireOutput
from tenancy.errors import BadRequest


def parse_wire_request(body: bytes) -> GenerateRequest:
    """A tokens-only request body; a 400 names the field."""
    try:
        return parse_generate_request(body)
    except InvalidRequestError as exc:
        raise BadRequest(exc.message, param=exc.param) from None


@dataclass(frozen=True)
class GenerateJob:
    wire: GenerateRequest
    base_model: str  # what a body without `model` runs on
    id_prefix: str = "gen"

    @property
    def model(self) -> str:
        return self.wire.model or self.base_model

    @property
    def priority_hint(self) -> int | None:
        # A priority the client did not send is the tier's default, not 0 clamped into the band.
        return self.wire.priority if "priority" in self.wire.model_fields_set else None

    @property
    def stream(self) -> bool:
        return self.wire.stream

    def plan(self, planner: Planner, target: EngineTarget) -> Plan:
        wire = self.wire
        if wire.features is not None:
            raise BadRequest(
                "features is not supported: this engine is text-only.", param="features"
            )
        planner.check_token_ids(wire.token_ids, param="token_ids")
        room = planner.room(len(wire.token_ids), param="token_ids")
        planner.check_sampling(wire.sampling_params)
        max_tokens = min(wire.sampling_params.max_tokens, room)
        params = wire.sampling_params.model_copy(update={"max_tokens": max_tokens})
        prompts = [wire.token_ids]
        output = WireOutput(
            wire.request_id,
            n=params.n,
            want_logprobs=params.logprobs is not None,
            include_usage=wire.include_usage,
            stream=wire.stream,
        )
        return Plan(
            requests=planner.engine_requests(prompts, params, target),
            reserve_tokens=reserve_tokens(prompts, params),
            output=output,
        )
