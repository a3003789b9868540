"""POST /v1/completions"""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from gateway.deps import BodyDep, StateDep, TenantDep
from gateway.openai.completions import CompletionJob
from gateway.openai.schemas import CompletionRequest, parse_body

router = APIRouter(tags=["inference"])


@router.post("/v1/completions", response_model=None)
async def completions(request: Request, state: StateDep, ctx: TenantDep, raw: BodyDep) -> Response:
    job = CompletionJob(parse_body(CompletionRequest, raw))
    return await state.lifecycle.serve(request, ctx, job)
