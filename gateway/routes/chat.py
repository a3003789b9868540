"""POST /v1/chat/completions"""

from __future__ import annotations

import time

from fastapi import APIRouter, Request, Response

from gateway.deps import BodyDep, StateDep, TenantDep
from gateway.inference import InferenceRun
from gateway.render_chat import ChatRenderer
from gateway.respond import respond
from gateway.schemas import ChatCompletionRequest, parse_body

router = APIRouter(tags=["inference"])


@router.post("/v1/chat/completions", response_model=None)
async def chat_completions(
    request: Request, state: StateDep, ctx: TenantDep, raw: BodyDep
) -> Response:
    body = parse_body(ChatCompletionRequest, raw)
    run = await InferenceRun.begin(
        state, request, ctx, body.model, prefix="chatcmpl", hint_priority=body.priority
    )
    coordinator = state.coordinator
    top = body.top_logprobs or 0
    plan = coordinator.plan(
        body,
        [coordinator.chat_prompt(body)],
        prompt_param="messages",
        max_tokens=body.requested_max_tokens,
        logprobs=top if body.logprobs else None,
        aliases={"logprobs": "top_logprobs"},
    )
    renderer = ChatRenderer(
        response_id=run.request_id,
        model=run.model.name,
        created=int(time.time()),
        num_choices=plan.n,
        tokenizer=state.tokenizer,
        include_usage=body.include_usage,
        want_logprobs=body.logprobs,
    )
    return await respond(request, run, plan, renderer, stream=body.stream)
