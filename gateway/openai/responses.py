"""The Responses API (`POST /v1/responses`), stateless: the request read as a chat.

`instructions` become a leading system message and `input` chat messages: a `function_call`
item joins the assistant message before it (or starts one) as a tool call, a
`function_call_output` item is a tool message. Function tools in the Responses shape become
chat's, `text.format` chat's `response_format`. From there it is chat's path (chat.py): the chat
template, tool_plan's grammar, text_sampling, TextOutput; only the answer's shape differs
(responses_render.py). Errors name fields as this API spells them (`input[2].arguments`,
`tools[0].name`, `max_output_tokens`, `text.format.schema`).

Nothing is stored: `previous_response_id`, `conversation` and `store: true` are a 400 naming
the field, and every answer says `"store": false`.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, ValidationError

from gateway.errors import UnsupportedField
from gateway.lifecycle.job import EngineTarget, Plan, Planner
from gateway.openai.responses_render import JSON, ResponseOutput, ResponseRenderer
from gateway.openai.schemas import BodyJob, Int64, SamplingFields, text_sampling
from gateway.openai.structured import Constraint, ResponseFormat, json_schema_constraint
from gateway.openai.tools import ToolPlan, tool_plan
from tenancy.errors import BadRequest, ClientError

STATELESS = "This server does not store responses; send the conversation in input."
# Fields of chat (SamplingFields) that this API spells otherwise: refused, never read.
_CHAT_SPELLINGS = {
    "max_tokens": "max_output_tokens",
    **dict.fromkeys(
        ("response_format", "structured_outputs", "guided_json", "guided_regex",
         "guided_choice", "guided_grammar"),
        "text.format",
    ),
}  # fmt: skip
_ROLES = {"user": "user", "system": "system", "developer": "system", "assistant": "assistant"}
_TEXT_PARTS = ("input_text", "output_text")
_TOOL_KEYS = ("name", "description", "parameters", "strict")  # of a function tool
_CHAT_TOOL_FIELD = re.compile(r"(tools\[\d+\])\.function\b")  # chat's tools[i].function.name


class ResponsesRequest(SamplingFields):
    """OpenAI's Responses body; vLLM's sampling extras (top_k, seed, stop, ...) as on chat."""

    input: str | list[dict[str, Any]]
    instructions: str | None = None
    max_output_tokens: Int64 | None = None
    metadata: dict[str, str] | None = Field(default=None, max_length=16)
    text: dict[str, Any] | None = None
    tools: Any = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    truncation: Literal["auto", "disabled"] | None = None
    # Read only to refuse them (check_supported).
    store: bool | None = None
    previous_response_id: str | None = None
    conversation: Any = None
    background: bool | None = None
    prompt: Any = None
    max_tool_calls: Int64 | None = None
    context_management: Any = None
    top_logprobs: Int64 | None = None
    include: list[str] | None = None

    def check_supported(self) -> None:
        super().check_supported()
        for name in ("previous_response_id", "conversation"):
            if getattr(self, name) is not None:
                raise BadRequest(STATELESS, param=name, code="unsupported_parameter")
        if self.store:
            raise BadRequest(STATELESS, param="store", code="unsupported_parameter")
        for name, ours in _CHAT_SPELLINGS.items():
            if getattr(self, name) is not None:
                raise BadRequest(
                    f"{name} is not a field of the Responses API; use {ours}.",
                    param=name,
                    code="unsupported_parameter",
                )
        if self.n != 1:
            raise BadRequest("The Responses API gives one answer.", param="n")
        for name in ("background", "prompt", "context_management", "top_logprobs"):
            if getattr(self, name) not in (None, False, 0, []):
                raise UnsupportedField(name)
        if self.max_tool_calls is not None:
            raise UnsupportedField("max_tool_calls")
        if self.include and "message.output_text.logprobs" in self.include:
            raise UnsupportedField("include")

    def echo(self, tools: ToolPlan | None) -> JSON:
        """The request's fields as the Response object repeats them."""
        fmt = (self.text or {}).get("format") or {"type": "text"}
        return {
            "instructions": self.instructions,
            "max_output_tokens": self.max_output_tokens,
            "metadata": self.metadata or {},
            "parallel_tool_calls": True if tools is None else tools.parallel,
            "previous_response_id": None,
            "reasoning": None,
            "store": False,
            "temperature": 1.0 if self.temperature is None else self.temperature,
            "text": {"format": fmt},
            "tool_choice": self.tool_choice if self.tool_choice is not None else "auto",
            "tools": [
                {"type": "function", **{k: tool.get(k) for k in _TOOL_KEYS}}
                for tool in self.tools or []
            ],
            "top_p": 1.0 if self.top_p is None else self.top_p,
            "truncation": self.truncation or "disabled",
            "user": self.user,
        }


@dataclass(frozen=True)
class ResponsesJob(BodyJob):
    body: ResponsesRequest
    id_prefix: str = "resp"

    def plan(self, planner: Planner, target: EngineTarget) -> Plan:
        body = self.body
        body.check_supported()
        messages = chat_messages(body.input, body.instructions)
        tools = responses_tool_plan(body.tools, body.tool_choice, body.parallel_tool_calls)
        constraint = text_constraint(body.text)
        if tools is not None:
            constraint = tools.constraint(constraint)
        tokenizer = planner.tokenizer
        with _renamed("messages", "input"):
            prompt = tokenizer.encode_chat(messages, None if tools is None else tools.tools)
        if not prompt:
            raise BadRequest("The input renders to an empty prompt.", param="input")
        with _renamed("max_tokens", "max_output_tokens"):
            sampling = text_sampling(
                planner,
                body,
                [prompt],
                prompt_param="input",
                max_tokens=body.max_output_tokens,
                aliases={"max_tokens": "max_output_tokens"},
                constraint=constraint,
            )
        renderer = ResponseRenderer(
            # OpenAI's ids read resp_...; the rest is the request id of the logs and ledger.
            response_id=target.request_id.replace("-", "_", 1),
            model=target.model.name,
            created_at=int(time.time()),
            echo=body.echo(tools),
            reads_calls=tools is not None and tools.reads_calls,
        )
        output = ResponseOutput(
            tokenizer,
            renderer,
            prompts=[prompt],
            stops=sampling.stops,
            include_stop=sampling.include_stop,
            stream=body.stream,
        )
        return sampling.plan(planner, target, [prompt], output)


# ---- input -> chat messages -------------------------------------------------------------------


def chat_messages(items: str | list[dict[str, Any]], instructions: str | None) -> list[JSON]:
    """`instructions` and `input` as the chat template reads messages (chat's shape, as
    ChatCompletionRequest.template_messages gives it)."""
    messages: list[JSON] = []
    if instructions:
        messages.append({"role": "system", "content": instructions})
    if isinstance(items, str):
        return [*messages, {"role": "user", "content": items}]
    if not items:
        raise BadRequest("input must not be empty.", param="input")
    for i, item in enumerate(items):
        where = f"input[{i}]"
        kind = item.get("type") or "message"
        if kind == "message":
            messages.append(_message(item, where))
        elif kind == "function_call":
            call = _call(item, where)
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            call_id = _string(item, "call_id", where)
            messages.append(
                {"role": "tool", "content": _output(item, where), "tool_call_id": call_id}
            )
        else:
            raise BadRequest(
                f"{where}.type is not supported by this server: input items are messages "
                "(text only), function_call and function_call_output.",
                param=f"{where}.type",
                code="unsupported_parameter",
            )
    return messages


def _message(item: dict[str, Any], where: str) -> JSON:
    role = item.get("role")
    role = _ROLES.get(role) if isinstance(role, str) else None
    if role is None:
        raise BadRequest(
            f"{where}.role must be user, system, developer or assistant.", param=f"{where}.role"
        )
    content = item.get("content")
    if isinstance(content, str):
        return {"role": role, "content": content}
    if not isinstance(content, list):
        raise BadRequest(
            f"{where}.content must be a string or a list of parts.", param=f"{where}.content"
        )
    return {"role": role, "content": "\n".join(_texts(content, f"{where}.content"))}


def _texts(parts: list[Any], where: str, kinds: tuple[str, ...] = _TEXT_PARTS) -> list[str]:
    texts = []
    for j, part in enumerate(parts):
        if not isinstance(part, dict) or part.get("type") not in kinds:
            raise BadRequest(
                f"{where}[{j}].type is not supported by this server: parts are "
                f"{' or '.join(kinds)}.",
                param=f"{where}[{j}].type",
                code="unsupported_parameter",
            )
        texts.append(_string(part, "text", f"{where}[{j}]", empty=True))
    return texts


def _call(item: dict[str, Any], where: str) -> JSON:
    name = _string(item, "name", where)
    call_id = _string(item, "call_id", where)
    text = _string(item, "arguments", where, empty=True)
    try:
        arguments = json.loads(text)
    except ValueError:
        arguments = None
    if not isinstance(arguments, dict):
        raise BadRequest(
            f"{where}.arguments must be a JSON object (as text).", param=f"{where}.arguments"
        )
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _output(item: dict[str, Any], where: str) -> str:
    output = item.get("output")
    if isinstance(output, list):
        return "\n".join(_texts(output, f"{where}.output", ("input_text",)))
    return _string(item, "output", where, empty=True)


def _string(item: dict[str, Any], key: str, where: str, *, empty: bool = False) -> str:
    value = item.get(key)
    if not isinstance(value, str) or not (value or empty):
        raise BadRequest(f"{where}.{key} must be a string.", param=f"{where}.{key}")
    return value


# ---- tools and text.format --------------------------------------------------------------------


def responses_tool_plan(
    tools: Any, tool_choice: Any, parallel_tool_calls: bool | None
) -> ToolPlan | None:
    """tools.py's plan for Responses-shaped tools and tool_choice (errors named as sent)."""
    if isinstance(tools, list):
        tools = [_chat_tool(tool, i) for i, tool in enumerate(tools)]
    if isinstance(tool_choice, dict):
        name = tool_choice.get("name")
        if tool_choice.get("type") != "function" or not isinstance(name, str):
            raise BadRequest(
                "tool_choice must be 'none', 'auto', 'required' or "
                '{"type": "function", "name": ...}.',
                param="tool_choice",
            )
        tool_choice = {"type": "function", "function": {"name": name}}
    try:
        return tool_plan(tools, tool_choice, parallel_tool_calls)
    except BadRequest as exc:
        raise _with_names(exc, lambda text: _CHAT_TOOL_FIELD.sub(r"\1", text)) from None


def _chat_tool(tool: Any, i: int) -> Any:
    if not isinstance(tool, dict):
        return tool  # tool_plan names it
    if tool.get("type") != "function":
        raise BadRequest(
            f"tools[{i}].type is not supported by this server: it runs function tools only.",
            param=f"tools[{i}].type",
            code="unsupported_parameter",
        )
    function = {k: tool[k] for k in _TOOL_KEYS if tool.get(k) is not None}
    return {"type": "function", "function": function}


def text_constraint(text: dict[str, Any] | None) -> Constraint | None:
    """`text.format` as chat's response_format constraint (its json_schema fields sit beside
    `type` here), or None for plain text."""
    fmt = (text or {}).get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise BadRequest("text.format must be an object.", param="text.format")
    if fmt.get("type") == "json_schema":
        keys = ("name", "description", "schema", "strict")
        fmt = {"type": "json_schema", "json_schema": {k: fmt[k] for k in keys if k in fmt}}
    try:
        constraint = json_schema_constraint(ResponseFormat.model_validate(fmt), "text.format")
    except ValidationError as exc:
        loc = [str(p) for p in exc.errors()[0]["loc"] if p != "json_schema"]
        param = ".".join(["text.format", *loc[:1]])
        raise BadRequest(f"Invalid value for {param}.", param=param) from None
    if constraint is None:
        return None
    return Constraint(constraint.wire, constraint.param.replace(".json_schema", ""))


# ---- errors named as this API spells its fields ---------------------------------------------


@contextmanager
def _renamed(old: str, new: str) -> Iterator[None]:
    """Re-raise a BadRequest about chat's field `old` as one about this API's `new`."""
    try:
        yield
    except BadRequest as exc:
        if exc.param != old:
            raise
        raise _with_names(exc, lambda text: text.replace(old, new)) from None


def _with_names(exc: ClientError, rename: Callable[[str], str]) -> BadRequest:
    return BadRequest(
        rename(exc.message),
        code=exc.code or "invalid_value",
        param=None if exc.param is None else rename(exc.param),
    )
