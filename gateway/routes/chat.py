"""POST /v1/chat/completions"""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from gateway.deps import BodyDep, StateDep, TenantDep
from gateway.openai.chat import ChatJob
from gateway.openai.schemas import ChatCompletionRequest, parse_body

router = APIRouter(tags=["inference"])


@router.post("/v1/chat/completions", response_model=None)
async def chat_completions(
    request: Request, state: StateDep, ctx: TenantDep, raw: BodyDep
) -> Response:
    job = ChatJob(parse_body(ChatCompletionRequest, raw))
    return await state.lifecycle.serve(request, ctx, job)
