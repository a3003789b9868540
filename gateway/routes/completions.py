"""POST /v1/completions"""

from __future__ import annotations

import time

from fastapi import APIRouter, Request, Response

from gateway.deps import BodyDep, StateDep, TenantDep
from gateway.inference import InferenceRun
from gateway.render_completion import CompletionRenderer
from gateway.respond import respond
from gateway.schemas import CompletionRequest, parse_body

router = APIRouter(tags=["inference"])


@router.post("/v1/completions", response_model=None)
async def completions(request: Request, state: StateDep, ctx: TenantDep, raw: BodyDep) -> Response:
    body = parse_body(CompletionRequest, raw)
    run = await InferenceRun.begin(
        state, request, ctx, body.model, prefix="cmpl", hint_priority=body.priority
    )
    coordinator = state.coordinator
    prompts = coordinator.completion_prompts(body)
    plan = coordinator.plan(
        body,
        prompts,
        prompt_param="prompt",
        max_tokens=body.requested_max_tokens,
        logprobs=body.logprobs,
        prompt_logprobs=body.logprobs if body.echo and body.logprobs is not None else None,
        aliases={"prompt_logprobs": "logprobs"},
    )
    renderer = CompletionRenderer(
        response_id=run.request_id,
        model=run.model.name,
        created=int(time.time()),
        prompts=prompts,
        n=plan.n,
        tokenizer=state.tokenizer,
        include_usage=body.include_usage,
        echo=body.echo,
        want_logprobs=body.logprobs is not None,
    )
    return await respond(request, run, plan, renderer, stream=body.stream)
