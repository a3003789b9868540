"""What an OpenAI body asks its output to match, as the engine's one `structured_outputs`.

A body may constrain its output in one of these ways, which name the same engine field:
OpenAI's `response_format` (`json_object`, `json_schema`), vLLM's `structured_outputs` object,
vLLM's older `guided_json` / `guided_regex` / `guided_choice` / `guided_grammar`, or a
`tool_choice` that requires a call (gateway/openai/tools.py builds that grammar). Two at once
are a 400 naming the second; so is anything the engine's own validation refuses, named as the
client spelled it (`Constraint.aliases` maps the engine's names back).

JSON whitespace: `LORAGATE_JSON_WHITESPACE` (compact by default) sets the engine's
`disable_any_whitespace` unless the client's `structured_outputs` object sets it; a vLLM engine
reads its own server flag instead (docs/operations.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from engine.protocol import StructuredOutputsParams
from gateway.errors import UnsupportedField
from tenancy.errors import BadRequest

_KINDS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: str = Field(min_length=1, max_length=64, pattern=r"^[a-zA-Z0-9_-]+$")
    description: str | None = None
    # OpenAI's field is `schema` (a BaseModel attribute name): the Python side says schema_.
    schema_: dict[str, Any] | bool | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    """OpenAI's `response_format` (chat, completions as vLLM takes it, and `text.format` of the
    Responses API, whose json_schema fields sit beside `type`)."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


@dataclass(frozen=True)
class Constraint:
    wire: StructuredOutputsParams
    param: str  # the client's field it came from, for 400s

    @property
    def aliases(self) -> dict[str, str]:
        """The engine's parameter names (without `sampling_params.`) -> the client's."""
        names = {"structured_outputs", *(f"structured_outputs.{k}" for k in _KINDS)}
        return {name: self.client_param(f"sampling_params.{name}") for name in names}

    def client_param(self, engine_param: str) -> str:
        """The client's name for an engine parameter: vLLM's `structured_outputs` object keeps
        its field names; any other form is named as a whole."""
        if self.param == "structured_outputs":
            return engine_param.removeprefix("sampling_params.")
        return self.param


def json_schema_constraint(fmt: ResponseFormat, param: str) -> Constraint | None:
    """`response_format` (or the Responses API's `text.format`) as a constraint, or None."""
    if fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return Constraint(StructuredOutputsParams(json_object=True), param)
    if fmt.json_schema is None:
        raise BadRequest(
            f"{param}.json_schema is required when {param}.type is json_schema.",
            param=f"{param}.json_schema",
        )
    schema = fmt.json_schema.schema_
    # OpenAI's default: an absent schema takes any JSON object
    wire = StructuredOutputsParams.model_validate(
        {"json": schema if schema is not None else {"type": "object"}}
    )
    return Constraint(wire, f"{param}.json_schema.schema")


def body_constraint(body: Any) -> Constraint | None:
    """The constraint a chat or completions body asks for (not counting its tool_choice)."""
    found: list[Constraint] = []
    if body.response_format is not None:
        try:
            fmt = ResponseFormat.model_validate(body.response_format)
        except ValidationError:
            raise UnsupportedField("response_format") from None
        constraint = json_schema_constraint(fmt, "response_format")
        if constraint is not None:
            found.append(constraint)
    if body.structured_outputs is not None:
        try:
            wire = StructuredOutputsParams.model_validate(body.structured_outputs)
        except ValidationError as exc:
            field = ".".join(str(p) for p in exc.errors()[0]["loc"])
            param = f"structured_outputs.{field}" if field else "structured_outputs"
            raise BadRequest(f"Invalid value for {param}.", param=param) from None
        found.append(Constraint(wire, "structured_outputs"))
    for name, kind in (
        ("guided_json", "json"),
        ("guided_regex", "regex"),
        ("guided_choice", "choice"),
        ("guided_grammar", "grammar"),
    ):
        value = getattr(body, name)
        if value is not None:
            fields: dict[str, Any] = {kind: value}
            if body.guided_whitespace_pattern is not None:
                fields["whitespace_pattern"] = body.guided_whitespace_pattern
            try:
                wire = StructuredOutputsParams.model_validate(fields)
            except ValidationError:
                raise BadRequest(f"Invalid value for {name}.", param=name) from None
            found.append(Constraint(wire, name))
    if len(found) > 1:
        raise BadRequest(
            f"{found[1].param} cannot be combined with {found[0].param}: "
            "a request takes one output constraint.",
            param=found[1].param,
        )
    return found[0] if found else None


def with_whitespace(constraint: Constraint, compact: bool) -> StructuredOutputsParams:
    """The wire object, with the gateway's whitespace default unless the client set one."""
    wire = constraint.wire
    if "disable_any_whitespace" in wire.model_fields_set:
        return wire
    return wire.model_copy(update={"disable_any_whitespace": compact})
