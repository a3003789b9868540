"""`tools`, `tool_choice` and `parallel_tool_calls`: what the model is shown and may (or must) do.

The tools are rendered into the prompt by the model's chat template (transformers'
`apply_chat_template(tools=...)`), in the format the template teaches; loragate reads calls back
in the Hermes / Qwen2.5 format (tool_calls.py). `tool_choice`:

- `none`: the tools are shown, no call is read out of the answer (it is plain content);
- `auto` (the default when tools are given): calls the model writes are read out of the answer;
- `required`, or a named function: the grammar of tool_grammar.py makes the answer one call (or,
  with `parallel_tool_calls`, one or more) to one of the allowed functions, with arguments valid
  against that function's `parameters`. This holds whatever the model's weights.

`ToolPlan.grammar` is that constraint; `auto` with a JSON `response_format` lets the answer be
either calls or that JSON (tool_grammar.calls_or_json_grammar).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from engine.protocol import StructuredOutputsParams
from gateway.openai.structured import Constraint
from gateway.openai.tool_grammar import (
    FunctionSpec,
    calls_or_json_grammar,
    check_function_name,
    tool_call_grammar,
)
from tenancy.errors import BadRequest

MAX_TOOLS = 128

Choice = Literal["none", "auto", "required", "named"]


@dataclass(frozen=True)
class ToolPlan:
    tools: list[dict[str, Any]]  # as the chat template reads them: OpenAI's tool objects
    functions: list[FunctionSpec]
    choice: Choice
    allowed: list[FunctionSpec]  # required: every function; named: that one
    parallel: bool

    @property
    def reads_calls(self) -> bool:
        return self.choice != "none"

    def constraint(self, response_format: Constraint | None) -> Constraint | None:
        """The grammar this choice needs, if any, merged with a JSON response format."""
        if self.choice in ("required", "named"):
            if response_format is not None:
                raise BadRequest(
                    f"{response_format.param} cannot be combined with tool_choice "
                    f"{self.choice!r}: the answer must be a tool call.",
                    param="tool_choice",
                )
            grammar = tool_call_grammar(self.allowed, parallel=self.parallel)
            return Constraint(StructuredOutputsParams(grammar=grammar), "tool_choice")
        if self.choice == "auto" and response_format is not None:
            schema = _json_of(response_format)
            if schema is None:
                return response_format  # a regex, choice or grammar: no calls fit it
            grammar = calls_or_json_grammar(self.functions, schema, parallel=self.parallel)
            return Constraint(StructuredOutputsParams(grammar=grammar), response_format.param)
        return response_format


def _json_of(constraint: Constraint) -> Any:
    wire = constraint.wire
    if wire.json_object:
        return {"type": "object"}
    return wire.json_ if isinstance(wire.json_, dict | bool) else None


def _function(tool: Any, i: int) -> tuple[dict[str, Any], FunctionSpec]:
    where = f"tools[{i}]"
    if not isinstance(tool, dict):
        raise BadRequest(f"{where} must be an object.", param=where)
    if tool.get("type", "function") != "function":
        raise BadRequest(
            f"{where}.type must be 'function' (the only kind of tool this server runs).",
            param=f"{where}.type",
        )
    function = tool.get("function")
    if not isinstance(function, dict):
        raise BadRequest(f"{where}.function is required.", param=f"{where}.function")
    name = function.get("name")
    if not isinstance(name, str):
        raise BadRequest(f"{where}.function.name is required.", param=f"{where}.function.name")
    try:
        check_function_name(name, field=f"{where}.function.name")
    except ValueError as exc:
        raise BadRequest(f"{exc}.", param=f"{where}.function.name") from None
    parameters = function.get("parameters")
    if parameters is not None and not isinstance(parameters, dict):
        raise BadRequest(
            f"{where}.function.parameters must be a JSON Schema object.",
            param=f"{where}.function.parameters",
        )
    description = function.get("description")
    if description is not None and not isinstance(description, str):
        raise BadRequest(
            f"{where}.function.description must be a string.",
            param=f"{where}.function.description",
        )
    rendered = {"type": "function", "function": function}
    return rendered, FunctionSpec(name=name, parameters=parameters)


def tool_plan(tools: Any, tool_choice: Any, parallel_tool_calls: bool | None) -> ToolPlan | None:
    """Validate the three fields; None when the request gives no tools (and asks for none)."""
    if tools is None or tools == []:
        if tool_choice not in (None, "none", "auto"):
            raise BadRequest("tool_choice needs tools to choose from.", param="tool_choice")
        return None
    if not isinstance(tools, list):
        raise BadRequest("tools must be a list.", param="tools")
    if len(tools) > MAX_TOOLS:
        raise BadRequest(f"tools holds more than {MAX_TOOLS} tools.", param="tools")
    pairs = [_function(tool, i) for i, tool in enumerate(tools)]
    functions = [spec for _, spec in pairs]
    names = [f.name for f in functions]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise BadRequest(
                f"tools[{i}].function.name {name!r} is given twice.",
                param=f"tools[{i}].function.name",
            )
    choice: Choice
    allowed = functions
    if tool_choice is None or tool_choice == "auto":
        choice = "auto"
    elif tool_choice in ("none", "required"):
        choice = tool_choice
    elif isinstance(tool_choice, dict) and tool_choice.get("type") == "function":
        wanted = (tool_choice.get("function") or {}).get("name")
        if not isinstance(wanted, str) or wanted not in names:
            raise BadRequest(
                "tool_choice names a function that is not among the tools.",
                param="tool_choice",
            )
        choice, allowed = "named", [functions[names.index(wanted)]]
    else:
        raise BadRequest(
            "tool_choice must be 'none', 'auto', 'required' or "
            '{"type": "function", "function": {"name": ...}}.',
            param="tool_choice",
        )
    return ToolPlan(
        tools=[rendered for rendered, _ in pairs],
        functions=functions,
        choice=choice,
        allowed=allowed,
        parallel=True if parallel_tool_calls is None else parallel_tool_calls,
    )
