"""`sampling_params.structured_outputs`: what a request's output must match, in vLLM's words.

One constraint per request, by vLLM's field names (`json`, `regex`, `choice`, `grammar`,
`json_object`, `structural_tag`), so a body means the same to loragate's engine and to a vLLM
server. `to_structured_spec` validates the wire form into a `StructuredSpec`: one kind, its
source in a canonical text (the cache key of a compiled grammar: JSON re-serialised compactly,
key order kept, since key order is the order the grammar generates), and the whitespace
options. `grammar_text` writes the spec as an llguidance grammar (engine/structured/ compiles
it against the tokenizer); `check_structured` runs llguidance's own validation without a
tokenizer, so the gateway refuses a bad schema, regex or grammar with a 400 naming the field
before anything is reserved, and the engine refuses it again at its own boundary.

Torch-free: the gateway imports it through engine.protocol.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal

import llguidance
from pydantic import BaseModel, ConfigDict, Field

from engine.errors import InvalidRequestError

StructuredKind = Literal["json", "regex", "choice", "grammar", "json_object", "structural_tag"]
KINDS: tuple[StructuredKind, ...] = (
    "json",
    "regex",
    "choice",
    "grammar",
    "json_object",
    "structural_tag",
)
# The largest constraint source, in characters (a request body is capped before this anyway:
# 8 MiB at the engine, 2 MiB at the gateway). llguidance bounds the compiled grammar itself.
MAX_SOURCE_CHARS = 4 << 20
MAX_CHOICES = 4096
# JSON nesting of a schema or structural tag: deeper is refused before any walk (Python's
# json and llguidance both recurse).
MAX_JSON_DEPTH = 64
# llguidance follows `$ref` chains and grammar rules by native recursion: a chain of ~1,000
# refs (68 kB of schema, 6 levels deep) or ~3,000 rules overflowed a thread's 8 MiB stack and
# took the process with it. These caps keep several times below that (600 refs and 2,000
# rules were measured safe) and above what real schemas and grammars use.
MAX_REFS = 128
MAX_GRAMMAR_RULES = 1000
_RULE = re.compile(r"^\s*[?!]?[A-Za-z_][\w.-]*\s*(?:\.\s*-?\d+\s*)?(?::|::=)", re.MULTILINE)


class StructuredOutputsParams(BaseModel):
    """The wire form (vLLM's `StructuredOutputsParams`); unknown fields are a 400."""

    model_config = ConfigDict(extra="forbid", serialize_by_alias=True)

    # `json` is BaseModel's (deprecated) method name: the field is json_ on the Python side.
    json_: str | dict[str, Any] | bool | None = Field(default=None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    structural_tag: str | dict[str, Any] | None = None
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None


@dataclass(frozen=True)
class StructuredSpec:
    """A validated constraint: what compiles, and what a compiled grammar is cached by."""

    kind: StructuredKind
    source: str  # canonical: compact JSON for json / choice / structural_tag, "" for json_object
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None

    @property
    def param(self) -> str:
        return f"sampling_params.structured_outputs.{self.kind}"


def _bad(field: str, why: str) -> InvalidRequestError:
    param = f"sampling_params.structured_outputs.{field}"
    return InvalidRequestError(f"{param} {why}", param=param)


def _depth_and_refs(value: Any) -> tuple[int, int]:
    """Nesting depth of parsed JSON and its number of `$ref` keys, without recursion (a hostile
    body must not blow the stack); stops counting past MAX_JSON_DEPTH + 1 levels."""
    deepest = refs = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > deepest:
            deepest = depth
            if deepest > MAX_JSON_DEPTH:
                break
        if isinstance(item, dict):
            refs += "$ref" in item
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
    return deepest, refs


def _json_source(field: str, value: str | dict[str, Any] | bool) -> str:
    if isinstance(value, str):
        if len(value) > MAX_SOURCE_CHARS:
            raise _bad(field, f"is longer than {MAX_SOURCE_CHARS} characters")
        try:
            value = json.loads(value)
        except (ValueError, RecursionError):
            raise _bad(field, "is not valid JSON") from None
    depth, refs = _depth_and_refs(value)
    if depth > MAX_JSON_DEPTH:
        raise _bad(field, f"nests deeper than {MAX_JSON_DEPTH} levels")
    if refs > MAX_REFS:
        raise _bad(field, f"holds more than {MAX_REFS} $ref")
    if field == "json" and value is False:
        raise _bad(field, "is the schema false, which no output matches")
    if field == "json" and not isinstance(value, dict | bool):
        raise _bad(field, "must be a JSON Schema: an object (or true)")
    if field == "structural_tag" and not isinstance(value, dict):
        raise _bad(field, "must be a JSON object")
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    if len(text) > MAX_SOURCE_CHARS:
        raise _bad(field, f"is longer than {MAX_SOURCE_CHARS} characters")
    return text


def to_structured_spec(wire: StructuredOutputsParams) -> StructuredSpec:
    """The one constraint a wire object names; raises InvalidRequestError naming the field."""
    given = [kind for kind in KINDS if _wire_value(wire, kind) is not None]
    if len(given) != 1:
        which = ", ".join(given) if given else "none"
        raise InvalidRequestError(
            "sampling_params.structured_outputs must set exactly one of "
            f"{', '.join(KINDS)} (set: {which})",
            param="sampling_params.structured_outputs",
        )
    kind = given[0]
    value = _wire_value(wire, kind)
    if kind in ("json", "structural_tag"):
        source = _json_source(kind, value)
    elif kind == "json_object":
        if value is not True:
            raise _bad(kind, "must be true when set")
        source = ""
    elif kind == "choice":
        if not value:
            raise _bad(kind, "must not be empty")
        if len(value) > MAX_CHOICES:
            raise _bad(kind, f"holds more than {MAX_CHOICES} strings")
        source = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
        if len(source) > MAX_SOURCE_CHARS:
            raise _bad(kind, f"is longer than {MAX_SOURCE_CHARS} characters")
    else:  # regex, grammar
        if not value.strip() and kind == "grammar":
            raise _bad(kind, "must not be empty")
        if "\x00" in value:
            raise _bad(kind, "must not contain a NUL character")
        if len(value) > MAX_SOURCE_CHARS:
            raise _bad(kind, f"is longer than {MAX_SOURCE_CHARS} characters")
        if kind == "grammar" and len(_RULE.findall(value)) > MAX_GRAMMAR_RULES:
            raise _bad(kind, f"has more than {MAX_GRAMMAR_RULES} rules")
        source = value
    if wire.whitespace_pattern is not None and len(wire.whitespace_pattern) > 1024:
        raise _bad("whitespace_pattern", "is longer than 1024 characters")
    return StructuredSpec(
        kind=kind,
        source=source,
        disable_any_whitespace=wire.disable_any_whitespace,
        disable_additional_properties=wire.disable_additional_properties,
        whitespace_pattern=wire.whitespace_pattern,
    )


def _wire_value(wire: StructuredOutputsParams, kind: StructuredKind) -> Any:
    return wire.json_ if kind == "json" else getattr(wire, kind)


# ---- the spec as an llguidance grammar --------------------------------------------------------


def _json_options(spec: StructuredSpec) -> Any:  # llguidance's JsonCompileOptions (a TypedDict)
    options: dict[str, Any] = {"whitespace_flexible": not spec.disable_any_whitespace}
    if spec.whitespace_pattern is not None:
        options["whitespace_pattern"] = spec.whitespace_pattern
    return options


def _schema_grammar(spec: StructuredSpec, schema: Any) -> str:
    if schema is True:
        schema = {}  # any JSON value (llguidance takes options on an object schema only)
    if spec.disable_additional_properties:
        schema = _closed_objects(schema)
    try:
        grammar: str = llguidance.LLMatcher.grammar_from_json_schema(
            schema, defaults=_json_options(spec)
        )
    except (ValueError, TypeError) as exc:
        raise InvalidRequestError(
            f"{spec.param} is not a supported JSON Schema: {_short(exc)}", param=spec.param
        ) from None
    return grammar


def _closed_objects(schema: Any) -> Any:
    """vLLM's disable_additional_properties: an object schema that lists properties and says
    nothing of others allows no others (a copy; the caller's schema is left alone)."""
    if isinstance(schema, list):
        return [_closed_objects(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: _closed_objects(value) for key, value in schema.items()}
    if "additionalProperties" not in out and isinstance(out.get("properties"), dict):
        out["additionalProperties"] = False
    return out


def _structural_tag_grammar(spec: StructuredSpec) -> str:
    """vLLM's structural tag: free text, and after any trigger the structure it begins, as
    `{"structures": [{"begin", "schema", "end"}], "triggers": [...]}`."""
    tag = json.loads(spec.source)
    triggers, structures = tag.get("triggers"), tag.get("structures")
    if not (isinstance(triggers, list) and all(isinstance(t, str) and t for t in triggers)):
        raise _bad("structural_tag", "needs `triggers`: a list of non-empty strings")
    if not (isinstance(structures, list) and structures):
        raise _bad("structural_tag", "needs `structures`: a non-empty list")
    tags = []
    for i, item in enumerate(structures):
        if not (
            isinstance(item, dict)
            and isinstance(item.get("begin"), str)
            and isinstance(item.get("end"), str)
            and isinstance(item.get("schema"), dict | bool)
        ):
            raise _bad("structural_tag", f"structures[{i}] needs begin, schema and end")
        trigger = next((t for t in triggers if item["begin"].startswith(t)), None)
        if trigger is None:
            raise _bad("structural_tag", f"structures[{i}].begin starts with no trigger")
        schema = {} if item["schema"] is True else item["schema"]
        if schema is False:
            raise _bad("structural_tag", f"structures[{i}].schema is false: nothing matches")
        if spec.disable_additional_properties:
            schema = _closed_objects(schema)
        # the schema itself, its JSON options inside: a StructTag embeds a grammar document
        # as a schema that allows any JSON (the structure would not be enforced)
        tags.append(
            llguidance.StructTag(
                trigger=trigger,
                begin=item["begin"],
                grammar={**schema, "x-guidance": _json_options(spec)},
                end=item["end"],
            )
        )
    grammar: str = llguidance.StructTag.to_grammar(tags)
    return grammar


def _schema_grammar_around(spec: StructuredSpec) -> str | None:
    """The grammar document `grammar_from_json_schema` would write, written around the
    schema's canonical text without parsing it; None where it must be parsed (options to
    merge, objects to close, a boolean schema). Why: llguidance parses a document while it holds
    the GIL, ~8 ms a megabyte each time, and the engine loop waits for the GIL."""
    source = spec.source
    if spec.disable_additional_properties or not source.startswith("{") or "x-guidance" in source:
        return None
    options = json.dumps(_json_options(spec), separators=(",", ":"))
    rest = source[1:]  # "}" or '"key":...}'
    schema = '{"x-guidance":' + options + ("}" if rest == "}" else "," + rest)
    return (
        '{"grammars":[{"name":"json_schema","json_schema":' + schema + ',"lark_grammar":null}],'
        '"max_tokens":null}'
    )


def grammar_text(spec: StructuredSpec) -> str:
    """The spec as the grammar llguidance compiles (vLLM's guidance backend's mapping)."""
    if spec.kind == "json":
        around = _schema_grammar_around(spec)
        if around is not None:
            return around
        return _schema_grammar(spec, json.loads(spec.source))
    if spec.kind == "json_object":
        return _schema_grammar(spec, {"type": "object"})
    if spec.kind == "structural_tag":
        return _structural_tag_grammar(spec)
    source: Any = json.loads(spec.source) if spec.kind == "choice" else spec.source
    try:
        grammar: str = llguidance.grammar_from(spec.kind, source)
    except (ValueError, TypeError) as exc:
        raise InvalidRequestError(
            f"{spec.param} does not compile: {_short(exc)}", param=spec.param
        ) from None
    return grammar


def check_structured(spec: StructuredSpec) -> str:
    """Validate without a tokenizer (syntax, schema features, sizes); returns the grammar.
    Raises InvalidRequestError naming the field; the message is llguidance's, shortened."""
    if spec.whitespace_pattern is not None:
        _check_whitespace_pattern(spec.whitespace_pattern)
    grammar = grammar_text(spec)
    error = llguidance.LLMatcher.validate_grammar(grammar, None)
    if error:
        raise InvalidRequestError(
            f"{spec.param} does not compile: {_short(error)}", param=spec.param
        )
    return grammar


def _check_whitespace_pattern(pattern: str) -> None:
    param = "sampling_params.structured_outputs.whitespace_pattern"
    try:
        error = llguidance.LLMatcher.validate_grammar(llguidance.grammar_from("regex", pattern))
    except (ValueError, TypeError) as exc:
        error = str(exc)
    if error:
        raise InvalidRequestError(f"{param} is not a regex: {_short(error)}", param=param)


def _short(error: object, limit: int = 300) -> str:
    """An error message cut to `limit` characters: llguidance quotes the offending text, which
    may be long; a 400 stays readable and a log line bounded."""
    text = " ".join(str(error).split()) or type(error).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."
