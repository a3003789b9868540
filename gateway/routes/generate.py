"""POST /inference/v1/generate: the tokens-only protocol, with the tenant's policy applied."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from gateway.deps import BodyDep, StateDep, TenantDep
from gateway.passthrough.job import GenerateJob, parse_wire_request

router = APIRouter(tags=["inference"])


@router.post("/inference/v1/generate", response_model=None)
async def generate(request: Request, state: StateDep, ctx: TenantDep, raw: BodyDep) -> Response:
    job = GenerateJob(parse_wire_request(raw), base_model=state.policy.base_model)
    return await state.lifecycle.serve(request, ctx, job)
