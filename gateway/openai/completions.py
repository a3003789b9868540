"""Completions: the job (one engine request per prompt: text, token ids, or lists of either)
and its renderer (`text_completion` bodies and streamed events, `echo`, legacy `logprobs`)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from engine.protocol import SSE_DONE, sse_json
from gateway.lifecycle.job import EngineTarget, Plan, Planner
from gateway.openai.render import JSON, LegacyLogprobs
from gateway.openai.schemas import BodyJob, CompletionRequest, text_sampling
from gateway.openai.structured import body_constraint
from gateway.openai.text_output import TextOutput
from gateway.text.choices import ChoiceDelta
from gateway.text.tokenizer import Tokenizer
from tenancy.errors import BadRequest


@dataclass(frozen=True)
class CompletionJob(BodyJob):
    body: CompletionRequest
    id_prefix: str = "cmpl"

    def plan(self, planner: Planner, target: EngineTarget) -> Plan:
        body = self.body
        prompts = _prompts(planner, body)
        echo_logprobs = body.echo and body.logprobs is not None
        sampling = text_sampling(
            planner,
            body,
            prompts,
            prompt_param="prompt",
            max_tokens=body.requested_max_tokens,
            logprobs=body.logprobs,
            prompt_logprobs=body.logprobs if echo_logprobs else None,
            aliases={"prompt_logprobs": "logprobs"},
            constraint=body_constraint(body),
        )
        params = sampling.params
        renderer = CompletionRenderer(
            response_id=target.request_id,
            model=target.model.name,
            created=int(time.time()),
            prompts=prompts,
            n=params.n,
            tokenizer=planner.tokenizer,
            include_usage=body.include_usage,
            echo=body.echo,
            want_logprobs=body.logprobs is not None,
        )
        output = TextOutput(
            planner.tokenizer,
            renderer,
            prompts=prompts,
            n=params.n,
            stops=sampling.stops,
            include_stop=sampling.include_stop,
            want_logprobs=params.logprobs is not None,
            stream=body.stream,
        )
        return sampling.plan(planner, target, prompts, output)


def _prompts(planner: Planner, body: CompletionRequest) -> list[list[int]]:
    prompt, tokenizer = body.prompt, planner.tokenizer
    prompts: list[list[int]]
    if isinstance(prompt, str):
        prompts = [tokenizer.encode(prompt)]
    elif prompt and all(isinstance(p, int) for p in prompt):
        prompts = [list(prompt)]  # type: ignore[arg-type]
    else:
        prompts = [
            tokenizer.encode(p) if isinstance(p, str) else list(p)  # type: ignore[arg-type]
            for p in prompt
        ]
    if not prompts:
        raise BadRequest("prompt must not be empty.", param="prompt")
    limit = planner.settings.max_prompts_per_request
    if len(prompts) > limit:
        raise BadRequest(f"At most {limit} prompts per request.", param="prompt")
    for ids in prompts:
        planner.check_token_ids(ids, param="prompt")
    return prompts


class CompletionRenderer:
    def __init__(
        self,
        *,
        response_id: str,
        model: str,
        created: int,
        prompts: list[list[int]],
        n: int,
        tokenizer: Tokenizer,
        include_usage: bool,
        echo: bool,
        want_logprobs: bool,
    ) -> None:
        self._head = {
            "id": response_id,
            "object": "text_completion",
            "created": created,
            "model": model,
        }
        self._tokenizer = tokenizer
        self._prompts = prompts
        self._n = n
        self._include_usage = include_usage
        self._echo = echo
        self._want_logprobs = want_logprobs
        num_choices = len(prompts) * n
        self._echo_texts = [tokenizer.decode(p) if echo else "" for p in prompts]
        self._texts: list[list[str]] = [[] for _ in range(num_choices)]
        self._logprobs = [
            LegacyLogprobs(tokenizer, len(self._echo_texts[i // n])) for i in range(num_choices)
        ]
        self._finish: list[tuple[str | None, str | int | None]] = [(None, None)] * num_choices

    def _prompt_logprobs(self, output: TextOutput, prompt: int) -> JSON | None:
        """The echoed prompt's own logprobs (position 0 has none, as in OpenAI)."""
        if not (self._echo and self._want_logprobs):
            return None
        rows = output.prompt_logprobs[prompt] or []
        out = LegacyLogprobs(self._tokenizer)
        for position, token_id in enumerate(self._prompts[prompt]):
            row = rows[position] if position < len(rows) else None
            if row is None:
                out.add(token_id, None, None)
                continue
            chosen = row.get(str(token_id))
            top = {self._tokenizer.token_text(int(t)): e.logprob for t, e in row.items()}
            out.add(token_id, chosen.logprob if chosen is not None else None, top)
        return out.take()

    # ---- whole ---------------------------------------------------------------------------------

    def add(self, deltas: list[ChoiceDelta]) -> None:
        for d in deltas:
            self._texts[d.index].append(d.text)
            if d.logprobs:
                self._logprobs[d.index].add_sampled(d.logprobs)
            if d.finish_reason is not None:
                self._finish[d.index] = (d.finish_reason, d.stop_reason)

    def body(self, output: TextOutput) -> JSON:
        choices = []
        for i, texts in enumerate(self._texts):
            prompt = i // self._n
            logprobs: JSON | None = None
            if self._want_logprobs:
                logprobs = self._logprobs[i].take()
                echoed = self._prompt_logprobs(output, prompt)
                if echoed is not None:
                    logprobs = {k: echoed[k] + logprobs[k] for k in logprobs}
            choices.append(
                {
                    "index": i,
                    "text": self._echo_texts[prompt] + "".join(texts),
                    "logprobs": logprobs,
                    "finish_reason": self._finish[i][0],
                    "stop_reason": self._finish[i][1],
                }
            )
        return {**self._head, "choices": choices, "usage": output.usage()}

    # ---- streamed ------------------------------------------------------------------------------

    def _chunk(self, choices: list[JSON], usage_json: JSON | None = None) -> bytes:
        payload: dict[str, Any] = {**self._head, "choices": choices}
        if self._include_usage:
            payload["usage"] = usage_json
        return sse_json(payload)

    def stream_start(self, output: TextOutput) -> list[bytes]:
        if not self._echo:
            return []
        return [
            self._chunk(
                [
                    {
                        "index": i,
                        "text": self._echo_texts[i // self._n],
                        "logprobs": self._prompt_logprobs(output, i // self._n),
                        "finish_reason": None,
                    }
                ]
            )
            for i in range(len(self._texts))
        ]

    def stream_deltas(self, deltas: list[ChoiceDelta]) -> list[bytes]:
        chunks = []
        for d in deltas:
            if not d.text and d.finish_reason is None and not d.logprobs:
                continue
            logprobs = None
            if self._want_logprobs:
                self._logprobs[d.index].add_sampled(d.logprobs or [])
                logprobs = self._logprobs[d.index].take()
            choice: JSON = {
                "index": d.index,
                "text": d.text,
                "logprobs": logprobs,
                "finish_reason": d.finish_reason,
            }
            if d.finish_reason is not None:
                choice["stop_reason"] = d.stop_reason
            chunks.append(self._chunk([choice]))
        return chunks

    def stream_end(self, output: TextOutput) -> list[bytes]:
        tail = [self._chunk([], output.usage())] if self._include_usage else []
        return [*tail, SSE_DONE]
