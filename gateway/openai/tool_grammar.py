"""A Lark grammar (llguidance's dialect) that lets a model write tool calls and nothing else.

For `tool_choice: "required"` (every given function) or a named function (that one alone), the
output must be what the chat template teaches (engine/make_model/tokenizer.py) and what
tool_calls.py reads back:

    <tool_call>\n{"name": "NAME", "arguments": {...}}\n</tool_call>

once, or (parallel calls) one or more times separated by "\n". One `%json` holds an `anyOf`
with one alternative per function: `name` as a const, then `arguments` valid against that
function's `parameters`, both required, no other key. Invariant: the JSON is laid out as
Python's `json.dumps` and transformers' `tojson` lay it out (", " and ": ", no other
whitespace), so a forced call looks exactly like the calls in the prompt.

llguidance departs from JSON Schema in ways a caller sees: object properties come in the order
`properties` lists them; unknown `format`s (e.g. "uri-reference") make the grammar invalid, so
check it with `llguidance.LLMatcher.validate_grammar` and refuse the request (its "lenient"
option would ignore them instead, and let through what the schema forbids); `\\uXXXX` escapes
are allowed only for U+0000 to U+001F and U+007F, which must be escaped (the model writes every
other character as is); and special tokens never match inside the JSON.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.openai.tool_calls import CLOSE_TAG, OPEN_TAG

_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")  # OpenAI's rule for function names

# llguidance's JSON options (read from "x-guidance" at the schema's top level only). The
# separators are regexes, matched exactly once each; with whitespace_flexible off no other
# whitespace is allowed anywhere in the value.
_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}

# Grammar literals (Lark strings take JSON's escapes).
_OPEN = json.dumps(OPEN_TAG + "\n")
_CLOSE = json.dumps("\n" + CLOSE_TAG)
# JSON Schema keywords whose values map names to schemas, and those whose values are data.
_SCHEMA_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions"})
_DATA_KEYWORDS = frozenset({"const", "enum", "default", "examples"})


@dataclass(frozen=True)
class FunctionSpec:
    name: str
    parameters: Mapping[str, Any] | None = None  # a JSON schema; None takes any object


def check_function_name(name: str, *, field: str = "name") -> None:
    """OpenAI's rule: 1 to 64 letters, digits, underscores or dashes."""
    if not _NAME.fullmatch(name):
        raise ValueError(f"{field} must be 1 to 64 letters, digits, underscores or dashes")


def tool_call_grammar(functions: Sequence[FunctionSpec], *, parallel: bool) -> str:
    """The grammar that accepts exactly one call (or, when `parallel`, one or more calls
    separated by "\\n") to one of `functions`, each with arguments valid for its schema."""
    if not functions:
        raise ValueError("functions must name at least one function")
    for i, function in enumerate(functions):
        check_function_name(function.name, field=f"functions[{i}].name")
    schema = {"x-guidance": _LAYOUT, "anyOf": [_call_schema(f, i) for i, f in enumerate(functions)]}
    # ASCII JSON: the grammar text then holds no character the Lark lexer could mistake.
    body = json.dumps(schema, ensure_ascii=True)
    start = 'call ("\\n" call)*' if parallel else "call"
    return f"start: {start}\ncall: {_OPEN} body {_CLOSE}\nbody: %json {body}\n"


def calls_or_json_grammar(
    functions: Sequence[FunctionSpec], schema: Mapping[str, Any] | bool, *, parallel: bool
) -> str:
    """`tool_choice: auto` with a JSON `response_format`: the answer is either tool calls (as
    `tool_call_grammar`) or one JSON value valid against `schema`, compact."""
    calls = tool_call_grammar(functions, parallel=parallel).replace("start: ", "calls: ", 1)
    wrapped: dict[str, Any] = {"allOf": [schema]} if isinstance(schema, bool) else dict(schema)
    wrapped["x-guidance"] = {"whitespace_flexible": False}
    answer = json.dumps(wrapped, ensure_ascii=True)
    return f"start: calls | answer\n{calls}answer: %json {answer}\n"


def _call_schema(function: FunctionSpec, index: int) -> dict[str, Any]:
    parameters: Any = {"type": "object"} if function.parameters is None else function.parameters
    # The parameters now sit inside a larger document, so their local references must be
    # rebased onto where they sit: "#/$defs/X" becomes "#/anyOf/<index>/properties/..."
    base = f"#/anyOf/{index}/properties/arguments"
    return {
        "type": "object",
        "properties": {"name": {"const": function.name}, "arguments": _rebase(parameters, base)},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def _rebase(schema: Any, base: str) -> Any:
    if isinstance(schema, list):  # anyOf, allOf, prefixItems, ...
        return [_rebase(item, base) for item in schema]
    if not isinstance(schema, Mapping):  # true, false, or a keyword's plain value
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "$ref" and isinstance(value, str) and value.startswith("#"):
            out[key] = base + value[1:]
        elif key in _SCHEMA_MAPS and isinstance(value, Mapping):
            out[key] = {name: _rebase(sub, base) for name, sub in value.items()}
        elif key in _DATA_KEYWORDS:
            out[key] = value
        else:
            out[key] = _rebase(value, base)
    return out
