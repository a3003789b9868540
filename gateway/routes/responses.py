"""POST /v1/responses (the Responses API, stateless: gateway/openai/responses.py)"""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from gateway.deps import BodyDep, StateDep, TenantDep
from gateway.openai.responses import ResponsesJob, ResponsesRequest
from gateway.openai.schemas import parse_body

router = APIRouter(tags=["inference"])


@router.post("/v1/responses", response_model=None)
async def responses(request: Request, state: StateDep, ctx: TenantDep, raw: BodyDep) -> Response:
    job = ResponsesJob(parse_body(ResponsesRequest, raw))
    return await state.lifecycle.serve(request, ctx, job)
