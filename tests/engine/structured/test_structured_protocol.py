"""`sampling_params.structured_outputs` on the wire (docs/tokens-api.md): every vLLM field name
accepted, every refusal a 400 naming its field, `check_structured` refusing what llguidance
cannot compile (and raising nothing else), and the canonical spec a compiled grammar is cached
by. Bodies are JSON text, parsed as the engine server parses them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from engine.errors import InvalidRequestError
from engine.protocol import (
    EngineLimits,
    StructuredOutputsParams,
    StructuredSpec,
    check_structured,
    parse_generate_request,
    to_engine_request,
    to_structured_spec,
)
from engine.structured import spec as spec_module
from engine.structured.spec import MAX_JSON_DEPTH

LIMITS = EngineLimits(vocab_size=4096, max_model_len=256, base_model_name="base")
PARAM = "sampling_params.structured_outputs"
SCHEMA = {"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "string"}}}
TAG = {
    "triggers": ["<f="],
    "structures": [{"begin": "<f=add>", "schema": {"type": "integer"}, "end": "</f>"}],
}


def body_text(structured: Any) -> str:
    return json.dumps({"token_ids": [1, 2], "sampling_params": {"structured_outputs": structured}})


def converted(structured: Any) -> StructuredSpec | None:
    request = to_engine_request(parse_generate_request(body_text(structured)), LIMITS)
    return request.sampling_params.structured_outputs


def refused(structured: Any) -> InvalidRequestError:
    with pytest.raises(InvalidRequestError) as info:
        converted(structured)
    assert info.value.status_code == 400
    return info.value


def nested(depth: int) -> str:
    """JSON text `depth` levels deep: objects around a number."""
    return '{"a":' * (depth - 1) + "1" + "}" * (depth - 1)


def wire_spec(**fields: Any) -> StructuredSpec:
    return to_structured_spec(StructuredOutputsParams.model_validate(fields))


# ---- every field accepted --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("structured", "kind", "source"),
    [
        ({"json": SCHEMA}, "json", json.dumps(SCHEMA, separators=(",", ":"))),
        ({"json": json.dumps(SCHEMA, indent=2)}, "json", json.dumps(SCHEMA, separators=(",", ":"))),
        ({"regex": r"[A-Z]{2}\d+"}, "regex", r"[A-Z]{2}\d+"),
        ({"choice": ["yes", "no", "né"]}, "choice", '["yes","no","né"]'),
        ({"grammar": 'root ::= "go"'}, "grammar", 'root ::= "go"'),
        ({"json_object": True}, "json_object", ""),
        ({"structural_tag": TAG}, "structural_tag", json.dumps(TAG, separators=(",", ":"))),
        (
            {"structural_tag": json.dumps(TAG)},
            "structural_tag",
            json.dumps(TAG, separators=(",", ":")),
        ),
    ],
)
def test_each_constraint_is_accepted_by_vllms_name(structured, kind, source):
    got = converted(structured)
    assert got is not None
    assert (got.kind, got.source) == (kind, source)
    assert got.param == f"{PARAM}.{kind}"
    assert (got.disable_any_whitespace, got.disable_additional_properties) == (False, False)
    assert got.whitespace_pattern is None


def test_the_whitespace_and_property_options_are_carried():
    got = converted(
        {
            "json": SCHEMA,
            "disable_any_whitespace": True,
            "disable_additional_properties": True,
            "whitespace_pattern": "[ ]?",
        }
    )
    assert got is not None
    assert got.disable_any_whitespace and got.disable_additional_properties
    assert got.whitespace_pattern == "[ ]?"
    check_structured(got)


def test_no_structured_outputs_is_no_constraint():
    assert converted(None) is None


# ---- refusals name their field ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("structured", "param", "says"),
    [
        ({"json": SCHEMA, "bogus": 1}, f"{PARAM}.bogus", "not a known field"),
        ({"guided_json": SCHEMA}, f"{PARAM}.guided_json", "not a known field"),
        ({"regex": "a", "choice": ["a"]}, PARAM, "set: regex, choice"),
        ({}, PARAM, "set: none"),
        ({"disable_any_whitespace": True}, PARAM, "exactly one"),
        ("json", PARAM, ""),
        ({"choice": []}, f"{PARAM}.choice", "must not be empty"),
        ({"choice": "yes"}, f"{PARAM}.choice", ""),
        ({"json": "{not json"}, f"{PARAM}.json", "is not valid JSON"),
        ({"json": "[1, 2]"}, f"{PARAM}.json", "must be a JSON Schema"),
        ({"json": '"a string"'}, f"{PARAM}.json", "must be a JSON Schema"),
        ({"json": 5}, f"{PARAM}.json", ""),
        ({"json": [SCHEMA]}, f"{PARAM}.json", ""),
        ({"structural_tag": "[1]"}, f"{PARAM}.structural_tag", "must be a JSON object"),
        ({"json_object": False}, f"{PARAM}.json_object", "must be true"),
        ({"json_object": 1}, f"{PARAM}.json_object", ""),
        ({"regex": "a\x00b"}, f"{PARAM}.regex", "NUL"),
        ({"grammar": 'root ::= "a\x00"'}, f"{PARAM}.grammar", "NUL"),
        ({"grammar": "  \n"}, f"{PARAM}.grammar", "must not be empty"),
        ({"regex": 5}, f"{PARAM}.regex", ""),
        ({"json": SCHEMA, "disable_any_whitespace": "yes"}, f"{PARAM}.disable_any_whitespace", ""),
        ({"json": SCHEMA, "whitespace_pattern": " " * 1025}, f"{PARAM}.whitespace_pattern", "1024"),
    ],
)
def test_a_bad_structured_outputs_is_a_400_naming_the_field(structured, param, says):
    error = refused(structured)
    assert error.param == param
    assert says in error.message


@pytest.mark.parametrize("as_text", [False, True])
def test_nesting_deeper_than_max_json_depth_is_refused_before_any_walk(as_text):
    deepest_allowed, too_deep = nested(MAX_JSON_DEPTH), nested(MAX_JSON_DEPTH + 1)
    for field in ("json", "structural_tag"):
        ok = deepest_allowed if as_text else json.loads(deepest_allowed)
        assert converted({field: ok}) is not None
        bad = too_deep if as_text else json.loads(too_deep)
        error = refused({field: bad})
        assert error.param == f"{PARAM}.{field}"
        assert f"nests deeper than {MAX_JSON_DEPTH} levels" in error.message


def test_a_hostile_depth_inside_a_json_string_is_a_400_not_a_recursion_error():
    error = refused({"json": nested(100_000)})
    assert error.param == f"{PARAM}.json"


@pytest.mark.xfail(
    strict=True,
    reason="pydantic's JSON parser stops at ~200 levels: the 400 says the body is not valid "
    "JSON and names no field (engine/protocol/requests.py _invalid, json_invalid)",
)
def test_a_hostile_depth_as_an_object_is_a_400_naming_the_field():
    error = refused({"json": json.loads(nested(300))})
    assert error.param == f"{PARAM}.json"


def test_sources_longer_than_max_source_chars_are_refused(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(spec_module, "MAX_SOURCE_CHARS", 64)
    long_schema = {"type": "object", "description": "x" * 80}
    cases = {
        "json": [long_schema, json.dumps(long_schema)],
        "structural_tag": [{**TAG, "note": "x" * 80}],
        "regex": ["a" * 65],
        "grammar": ['root ::= "' + "a" * 60 + '"'],
        "choice": [["word"] * 20],
    }
    for field, values in cases.items():
        for value in values:
            error = refused({field: value})
            assert error.param == f"{PARAM}.{field}"
            assert "longer than 64 characters" in error.message
    assert converted({"regex": "a" * 64}) is not None  # the limit itself is allowed


def test_more_than_max_choices_is_refused(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(spec_module, "MAX_CHOICES", 3)
    assert converted({"choice": ["a", "b", "c"]}) is not None
    error = refused({"choice": ["a", "b", "c", "d"]})
    assert (error.param, "more than 3" in error.message) == (f"{PARAM}.choice", True)


# ---- check_structured: what llguidance refuses without a tokenizer ---------------------------


@pytest.mark.parametrize(
    ("fields", "param", "says"),
    [
        (
            {"json": {"type": "object", "properties": {"k": {"$ref": "#/nowhere"}}}},
            "json",
            "nowhere",
        ),
        ({"json": {"type": "strin"}}, "json", "strin"),
        ({"json": {"type": "integer", "minimum": 5, "maximum": 1}}, "json", "Unsatisfiable"),
        ({"json": {"type": "string", "format": "nope"}}, "json", "nope"),
        ({"json": {"$ref": "http://example.com/schema"}}, "json", "example.com"),
        ({"regex": "("}, "regex", "unclosed group"),
        ({"regex": "[a-"}, "regex", "does not compile"),
        ({"grammar": "start: foo"}, "grammar", "foo"),
        ({"grammar": "%%%"}, "grammar", "does not compile"),
        ({"structural_tag": {"triggers": ["<"], "structures": []}}, "structural_tag", "non-empty"),
        (
            {"structural_tag": {"triggers": ["<"], "structures": [{"begin": "x", "end": "y"}]}},
            "structural_tag",
            "begin, schema and end",
        ),
    ],
)
def test_check_structured_refuses_what_does_not_compile(fields, param, says):
    with pytest.raises(InvalidRequestError) as info:
        check_structured(wire_spec(**fields))
    assert info.value.param == f"{PARAM}.{param}"
    assert says in info.value.message
    assert len(info.value.message) < 400  # llguidance's quote of the source is cut short


@pytest.mark.parametrize(
    "fields",
    [
        {"json": {"type": 5}},
        {"json": {"minimum": "x", "type": "integer"}},
        {"json": {"properties": []}},
        {"json": {"enum": []}},
        {"json": {"allOf": [{"type": "string"}, {"type": "integer"}]}},
        {"json": {"type": "string", "pattern": "("}},
        {"json": False},
        {"json": True},
        {"json": {"type": "object"}, "whitespace_pattern": "["},
        {"regex": "(?P<x>a)(?P=x)"},
        {"regex": "\\"},
        {"grammar": "root ::= "},
        {"grammar": "start: /(/"},
        {"grammar": "start: " + "(" * 500 + '"a"' + ")" * 500},
        {"structural_tag": {"triggers": "<", "structures": [{"begin": "<", "schema": {}}]}},
        {"choice": [""]},
    ],
)
def test_check_structured_raises_nothing_but_a_400(fields):
    try:
        grammar = check_structured(wire_spec(**fields))
    except InvalidRequestError as exc:
        assert exc.param is not None and exc.param.startswith(f"{PARAM}.")
    else:
        assert isinstance(grammar, str) and grammar


def test_a_boolean_schema_true_compiles():
    check_structured(wire_spec(json=True))


def test_a_bad_whitespace_pattern_names_its_field():
    with pytest.raises(InvalidRequestError) as info:
        check_structured(wire_spec(json={"type": "object"}, whitespace_pattern="["))
    assert info.value.param == f"{PARAM}.whitespace_pattern"


CRASH_CHECK = """
import json, sys
from engine.errors import InvalidRequestError
from engine.structured.spec import StructuredOutputsParams, check_structured, to_structured_spec
try:
    check_structured(to_structured_spec(StructuredOutputsParams.model_validate_json(sys.stdin.read())))
except InvalidRequestError as exc:
    print("400", exc.param)
else:
    print("compiled")
"""


def _ref_chain(n: int) -> dict[str, Any]:
    defs: dict[str, Any] = {
        f"d{i}": {"type": "object", "properties": {"x": {"$ref": f"#/$defs/d{i + 1}"}}}
        for i in range(n)
    }
    defs[f"d{n}"] = {"type": "integer"}
    return {"json": {"$defs": defs, "$ref": "#/$defs/d0"}}


def _rule_chain(n: int) -> dict[str, Any]:
    rules = "\n".join(f"r{i}: r{i + 1}" for i in range(n))
    return {"grammar": f'start: r0\n{rules}\nr{n}: "a"'}


@pytest.mark.parametrize("fields", [_ref_chain(1000), _rule_chain(3000)], ids=["refs", "rules"])
def test_a_long_chain_of_references_is_a_400_and_the_process_survives(fields):
    done = subprocess.run(
        [sys.executable, "-c", CRASH_CHECK],
        cwd=Path(__file__).resolve().parents[3],  # the repository root: `engine` imports
        input=json.dumps(fields),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, f"the check died with {done.returncode}"
    assert done.stdout.split()[0] == "400"


# ---- the canonical spec: one cache entry per meaning -----------------------------------------


def test_a_schema_as_object_or_as_text_in_any_whitespace_is_one_spec():
    as_object = converted({"json": SCHEMA})
    as_text = converted({"json": json.dumps(SCHEMA)})
    spaced = converted({"json": json.dumps(SCHEMA, indent=4).replace("\n", "\r\n\t")})
    assert as_object == as_text == spaced
    assert len({as_object, as_text, spaced}) == 1  # one cache key
    tag_object, tag_text = (
        converted({"structural_tag": TAG}),
        converted({"structural_tag": json.dumps(TAG, indent=1)}),
    )
    assert tag_object == tag_text


def test_key_order_is_kept_and_makes_another_spec():
    """Properties are generated in the order they are listed: a reordered schema is another
    grammar."""
    reordered = {"type": "object", "properties": dict(reversed(SCHEMA["properties"].items()))}
    first, second = converted({"json": SCHEMA}), converted({"json": reordered})
    assert first is not None and second is not None
    assert first.source.index('"b"') < first.source.index('"a"')
    assert second.source.index('"a"') < second.source.index('"b"')
    assert first != second


def test_options_and_non_ascii_text_are_part_of_the_spec():
    base = converted({"json": SCHEMA})
    compact = converted({"json": SCHEMA, "disable_any_whitespace": True})
    closed = converted({"json": SCHEMA, "disable_additional_properties": True})
    assert len({base, compact, closed}) == 3
    unicode = converted({"json": {"enum": ["café", "日本"]}})
    assert unicode is not None and unicode.source == '{"enum":["café","日本"]}'
