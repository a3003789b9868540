"""POST /inference/v1/generate: the tokens-only protocol, with the tenant's policy applied."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from gateway.deps import BodyDep, StateDep, TenantDep
from gateway.engine_client import parse_wire_request
from gateway.inference import InferenceRun
from gateway.passthrough_respond import engine_request, respond_passthrough

router = APIRouter(tags=["inference"])


@router.post("/inference/v1/generate", response_model=None)
async def generate(request: Request, state: StateDep, ctx: TenantDep, raw: BodyDep) -> Response:
    wire = parse_wire_request(raw)
    # A priority the client did not send is the tier's default, not 0 clamped into the band.
    hint = wire.priority if "priority" in wire.model_fields_set else None
    run = await InferenceRun.begin(
        state,
        request,
        ctx,
        wire.model or state.policy.base_model,
        prefix="gen",
        hint_priority=hint,
    )
    return await respond_passthrough(
        request, run, engine_request(state.coordinator, run, wire), wire
    )
