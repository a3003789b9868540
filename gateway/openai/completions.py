"""Completions: the job (one engine request per prompt: text, token ids, or lists of either)
and its renderer (`text_completion` bodies and streamed events, `echo`, legacy `logprobs`)."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.lifecycle.job import EngineTarget, Plan, Planner
from gateway.openai.render import JSON, Answer, Envelope, LegacyLogprobs
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
            Envelope.now(target, "text_completion", include_usage=body.include_usage),
            prompts=prompts,
            n=params.n,
            tokenizer=planner.tokenizer,
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
        envelope: Envelope,
        *,
        prompts: list[list[int]],
        n: int,
        tokenizer: Tokenizer,
        echo: bool,
        want_logprobs: bool,
    ) -> None:
        self._envelope = envelope
        self._tokenizer = tokenizer
        self._prompts = prompts
        self._n = n
        self._echo = echo
        self._want_logprobs = want_logprobs
        num_choices = len(prompts) * n
        self._echo_texts = [tokenizer.decode(p) if echo else "" for p in prompts]
        self._answer = Answer(num_choices)
        # Streamed, each chunk's logprobs carry on the text offsets of the chunks before it.
        self._streamed_logprobs = [self._sampled_logprobs(i) for i in range(num_choices)]

    def _sampled_logprobs(self, choice: int) -> LegacyLogprobs:
        return LegacyLogprobs(self._tokenizer, len(self._echo_texts[choice // self._n]))

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
        self._answer.add(deltas)

    def body(self, output: TextOutput) -> JSON:
        choices = []
        for i, choice in enumerate(self._answer.choices):
            prompt = i // self._n
            logprobs: JSON | None = None
            if self._want_logprobs:
                sampled = self._sampled_logprobs(i)
                sampled.add_sampled(choice.logprobs)
                logprobs = sampled.take()
                echoed = self._prompt_logprobs(output, prompt)
                if echoed is not None:
                    logprobs = {k: echoed[k] + logprobs[k] for k in logprobs}
            choices.append(
                {
                    "index": i,
                    "text": self._echo_texts[prompt] + choice.text,
                    "logprobs": logprobs,
                    "finish_reason": choice.finish_reason,
                    "stop_reason": choice.stop_reason,
                }
            )
        return self._envelope.body(choices, output.usage())

    # ---- streamed ------------------------------------------------------------------------------

    def stream_start(self, output: TextOutput) -> list[bytes]:
        if not self._echo:
            return []
        return [
            self._envelope.chunk(
                [
                    {
                        "index": i,
                        "text": self._echo_texts[i // self._n],
                        "logprobs": self._prompt_logprobs(output, i // self._n),
                        "finish_reason": None,
                    }
                ]
            )
            for i in range(len(self._answer.choices))
        ]

    def stream_deltas(self, deltas: list[ChoiceDelta]) -> list[bytes]:
        chunks = []
        for d in deltas:
            if not d.text and d.finish_reason is None and not d.logprobs:
                continue
            logprobs = None
            if self._want_logprobs:
                self._streamed_logprobs[d.index].add_sampled(d.logprobs or [])
                logprobs = self._streamed_logprobs[d.index].take()
            choice: JSON = {
                "index": d.index,
                "text": d.text,
                "logprobs": logprobs,
                "finish_reason": d.finish_reason,
            }
            if d.finish_reason is not None:
                choice["stop_reason"] = d.stop_reason
            chunks.append(self._envelope.chunk([choice]))
        return chunks

    def stream_end(self, output: TextOutput) -> list[bytes]:
        return self._envelope.stream_end(output.usage())
