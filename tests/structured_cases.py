"""JSON Schemas that structured-output tests send, shared by the engine, gateway and vLLM suites.

Each covers a keyword family a schema in the wild uses. Every string carries a `maxLength` or
a `pattern`, every array a `maxItems`, every integer a range and every number a range and a
`multipleOf` (which bounds its fraction digits), so that even a random-weight model finishes
every answer well inside `MAX_TOKENS`: on such a model digits are as likely as anything, and an
unbounded number or string runs until the token budget ends it mid-JSON (tried: most of them
did).
"""

from __future__ import annotations

from typing import Any

MAX_TOKENS = 320

_NAME = {"type": "string", "maxLength": 12}
_INT = {"type": "integer", "minimum": -999, "maximum": 999}

SCHEMAS: dict[str, dict[str, Any]] = {
    "flat": {
        "type": "object",
        "properties": {"name": _NAME, "age": {"type": "integer", "minimum": 0, "maximum": 130}},
        "required": ["name", "age"],
        "additionalProperties": False,
    },
    "nested": {
        "type": "object",
        "properties": {
            "user": {
                "type": "object",
                "properties": {
                    "id": {"type": "integer", "minimum": 1, "maximum": 9999},
                    "address": {
                        "type": "object",
                        "properties": {
                            "city": _NAME,
                            "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
                        },
                        "required": ["city", "zip"],
                        "additionalProperties": False,
                    },
                },
                "required": ["id", "address"],
                "additionalProperties": False,
            }
        },
        "required": ["user"],
        "additionalProperties": False,
    },
    "array_bounds": {
        "type": "array",
        "items": {"type": "integer", "minimum": -50, "maximum": 50},
        "minItems": 2,
        "maxItems": 4,
    },
    "enum": {
        "type": "object",
        "properties": {"color": {"enum": ["red", "green", "blue"]}},
        "required": ["color"],
        "additionalProperties": False,
    },
    "const": {
        "type": "object",
        "properties": {"version": {"const": 2}, "kind": {"const": "report"}},
        "required": ["version", "kind"],
        "additionalProperties": False,
    },
    "any_of_null": {
        "type": "object",
        "properties": {"note": {"anyOf": [_NAME, {"type": "null"}]}},
        "required": ["note"],
        "additionalProperties": False,
    },
    "number_range": {
        "type": "object",
        "properties": {
            "score": {"type": "number", "minimum": 0, "maximum": 1, "multipleOf": 0.01},
            "temp": {
                "type": "number",
                "exclusiveMinimum": -40,
                "exclusiveMaximum": 60,
                "multipleOf": 0.5,
            },
        },
        "required": ["score", "temp"],
        "additionalProperties": False,
    },
    "integer_range": {"type": "integer", "minimum": 10, "maximum": 99},
    "string_pattern": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"},
    "string_lengths": {"type": "string", "minLength": 3, "maxLength": 8},
    "tuple": {
        "type": "array",
        "prefixItems": [{"type": "string", "maxLength": 6}, _INT, {"type": "boolean"}],
        "items": False,
    },
    "boolean_flags": {
        "type": "object",
        "properties": {"done": {"type": "boolean"}, "urgent": {"type": "boolean"}},
        "required": ["done", "urgent"],
        "additionalProperties": False,
    },
    "array_of_objects": {
        "type": "array",
        "items": {
            "type": "object",
            "properties": {"x": _INT, "y": _INT},
            "required": ["x", "y"],
            "additionalProperties": False,
        },
        "minItems": 1,
        "maxItems": 3,
    },
    "optional_fields": {
        "type": "object",
        "properties": {"title": _NAME, "pages": {"type": "integer", "minimum": 1, "maximum": 500}},
        "required": ["title"],
        "additionalProperties": False,
    },
    "defs_ref": {
        "$defs": {"point": {"type": "array", "prefixItems": [_INT, _INT], "items": False}},
        "type": "object",
        "properties": {"a": {"$ref": "#/$defs/point"}, "b": {"$ref": "#/$defs/point"}},
        "required": ["a", "b"],
        "additionalProperties": False,
    },
    "one_of": {
        "oneOf": [
            {
                "type": "object",
                "properties": {"cat": {"const": "meow"}},
                "required": ["cat"],
                "additionalProperties": False,
            },
            {
                "type": "object",
                "properties": {"dog": {"type": "integer", "minimum": 0, "maximum": 9}},
                "required": ["dog"],
                "additionalProperties": False,
            },
        ]
    },
    "enum_mixed": {"enum": ["yes", "no", 0, 1, None, True]},
    "array_unique_enum": {
        "type": "array",
        "items": {"enum": ["a", "b", "c"]},
        "maxItems": 3,
    },
    "deep_nesting": {
        "type": "object",
        "properties": {
            "l1": {
                "type": "object",
                "properties": {
                    "l2": {
                        "type": "object",
                        "properties": {"l3": {"type": "array", "items": _NAME, "maxItems": 2}},
                        "required": ["l3"],
                        "additionalProperties": False,
                    }
                },
                "required": ["l2"],
                "additionalProperties": False,
            }
        },
        "required": ["l1"],
        "additionalProperties": False,
    },
    "email_like": {
        "type": "object",
        "properties": {"email": {"type": "string", "pattern": "^[a-z]{1,8}@[a-z]{1,8}\\.com$"}},
        "required": ["email"],
        "additionalProperties": False,
    },
    "date_pattern": {"type": "string", "pattern": "^20[0-9]{2}-[01][0-9]-[0-3][0-9]$"},
    "matrix": {
        "type": "array",
        "items": {"type": "array", "items": _INT, "minItems": 2, "maxItems": 2},
        "minItems": 2,
        "maxItems": 2,
    },
}
