"""Chat completions: the job (messages and tools -> chat template -> one engine request, its
output constraint from response_format / tool_choice) and its renderer (`chat.completion`
bodies, `chat.completion.chunk` events; tool calls read out of the answer by tool_output.py)."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.lifecycle.job import EngineTarget, Plan, Planner
from gateway.openai.render import JSON, Answer, Envelope, chat_logprobs
from gateway.openai.schemas import BodyJob, ChatCompletionRequest, text_sampling
from gateway.openai.structured import body_constraint
from gateway.openai.text_output import TextOutput
from gateway.openai.tool_output import ChoiceTools
from gateway.openai.tools import tool_plan
from gateway.text.choices import ChoiceDelta, TokenLogprob
from gateway.text.tokenizer import Tokenizer
from tenancy.errors import BadRequest


@dataclass(frozen=True)
class ChatJob(BodyJob):
    body: ChatCompletionRequest
    id_prefix: str = "chatcmpl"

    def plan(self, planner: Planner, target: EngineTarget) -> Plan:
        body = self.body
        tokenizer = planner.tokenizer
        tools = tool_plan(body.tools, body.tool_choice, body.parallel_tool_calls)
        constraint = body_constraint(body)
        if tools is not None:
            constraint = tools.constraint(constraint)
        prompt = tokenizer.encode_chat(
            body.template_messages(), None if tools is None else tools.tools
        )
        if not prompt:
            raise BadRequest("The messages render to an empty prompt.", param="messages")
        top = body.top_logprobs or 0
        # A 400 about max tokens names the field the client used.
        named = (
            {} if body.max_completion_tokens is None else {"max_tokens": "max_completion_tokens"}
        )
        sampling = text_sampling(
            planner,
            body,
            [prompt],
            prompt_param="messages",
            max_tokens=body.requested_max_tokens,
            logprobs=top if body.logprobs else None,
            aliases={"logprobs": "top_logprobs", **named},
            constraint=constraint,
        )
        params = sampling.params
        renderer = ChatRenderer(
            Envelope.now(target, "chat.completion.chunk", include_usage=body.include_usage),
            num_choices=params.n,
            tokenizer=tokenizer,
            want_logprobs=body.logprobs,
            reads_tool_calls=tools is not None and tools.reads_calls,
        )
        output = TextOutput(
            tokenizer,
            renderer,
            prompts=[prompt],
            n=params.n,
            stops=sampling.stops,
            include_stop=sampling.include_stop,
            want_logprobs=params.logprobs is not None,
            stream=body.stream,
        )
        return sampling.plan(planner, target, [prompt], output)


class ChatRenderer:
    def __init__(
        self,
        envelope: Envelope,
        *,
        num_choices: int,
        tokenizer: Tokenizer,
        want_logprobs: bool,
        reads_tool_calls: bool = False,
    ) -> None:
        self._envelope = envelope
        self._tokenizer = tokenizer
        self._want_logprobs = want_logprobs
        self._num_choices = num_choices
        self._answer = Answer(num_choices)
        # per choice, where tool calls are read out of the answer
        self._tools = [ChoiceTools() for _ in range(num_choices)] if reads_tool_calls else None

    def _logprobs_json(self, entries: list[TokenLogprob] | None) -> JSON | None:
        if not self._want_logprobs:
            return None
        return {"content": chat_logprobs(self._tokenizer, entries or []), "refusal": None}

    # ---- whole ---------------------------------------------------------------------------------

    def add(self, deltas: list[ChoiceDelta]) -> None:
        self._answer.add(deltas)

    def body(self, output: TextOutput) -> JSON:
        choices = []
        for i, choice in enumerate(self._answer.choices):
            text = choice.text
            message: JSON = {"role": "assistant", "content": text, "refusal": None}
            reason = choice.finish_reason
            if self._tools is not None:
                content, calls = self._tools[i].message(text)
                message["content"] = content
                if calls:
                    message["tool_calls"] = calls
                    reason = _with_calls(reason)
            choices.append(
                {
                    "index": i,
                    "message": message,
                    "logprobs": self._logprobs_json(choice.logprobs),
                    "finish_reason": reason,
                    "stop_reason": choice.stop_reason,
                }
            )
        return self._envelope.body(choices, output.usage(), object="chat.completion")

    # ---- streamed ------------------------------------------------------------------------------

    def stream_start(self, output: TextOutput) -> list[bytes]:
        return [
            self._envelope.chunk(
                [
                    {
                        "index": i,
                        "delta": {"role": "assistant", "content": ""},
                        "logprobs": None,
                        "finish_reason": None,
                    }
                ]
            )
            for i in range(self._num_choices)
        ]

    def stream_deltas(self, deltas: list[ChoiceDelta]) -> list[bytes]:
        chunks = []
        for d in deltas:
            delta: JSON = {"content": d.text} if d.text else {}
            reason = d.finish_reason
            if self._tools is not None:
                tools = self._tools[d.index]
                content, calls = tools.stream(d.text, final=reason is not None)
                delta = {"content": content} if content else {}
                if calls:
                    delta["tool_calls"] = calls
                if tools.has_calls:
                    reason = _with_calls(reason)
            if not delta and reason is None and not d.logprobs:
                continue
            choice: JSON = {
                "index": d.index,
                "delta": delta,
                "logprobs": self._logprobs_json(d.logprobs) if d.logprobs else None,
                "finish_reason": reason,
            }
            if reason is not None:
                choice["stop_reason"] = d.stop_reason
            chunks.append(self._envelope.chunk([choice]))
        return chunks

    def stream_end(self, output: TextOutput) -> list[bytes]:
        return self._envelope.stream_end(output.usage())


def _with_calls(reason: str | None) -> str | None:
    """OpenAI's finish_reason for an answer that made tool calls and ended by itself."""
    return "tool_calls" if reason == "stop" else reason
