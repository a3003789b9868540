"""tool_call_grammar: the grammar that forces tool calls accepts what the chat template writes for
valid calls, and nothing else (matched with llguidance on the tiny model's tokenizer)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import llguidance
import llguidance.hf
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from gateway.openai.tool_calls import (
    CLOSE_TAG,
    OPEN_TAG,
)
from gateway.openai.tool_grammar import FunctionSpec, check_function_name, tool_call_grammar
from tests.gateway.openai.tool_call_helpers import call_text, parse

WEATHER = FunctionSpec(
    "get_weather",
    {
        "type": "object",
        "properties": {
            "city": {"type": "string", "description": "Zürich, Genève } { ..."},
            "days": {"type": "integer", "minimum": 1},
            "unit": {"enum": ["c", "f"]},
        },
        "required": ["city"],
        "additionalProperties": False,
    },
)
NOOP = FunctionSpec("noop")  # no parameters: any object
TREE = FunctionSpec(  # local references, which must follow the schema into the grammar
    "plant-tree",
    {
        "type": "object",
        "properties": {"root": {"$ref": "#/$defs/node"}},
        "required": ["root"],
        "$defs": {
            "node": {
                "type": "object",
                "properties": {
                    "label": {"type": "string"},
                    "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}},
                },
                "required": ["label"],
                "additionalProperties": False,
            }
        },
    },
)
FUNCTIONS = [WEATHER, NOOP, TREE]

GOOD_CALLS: list[tuple[str, Any]] = [
    ("get_weather", {"city": "Zürich"}),
    ("get_weather", {"city": 'a "quoted" } { city', "days": 3, "unit": "f"}),
    ("noop", {}),
    ("noop", {"anything": [1, 2.5, None, {"x": True}]}),
    ("plant-tree", {"root": {"label": "a", "kids": [{"label": "b"}, {"label": "c", "kids": []}]}}),
]


@pytest.fixture(scope="module")
def accepts(tiny_model_dir: Path) -> Callable[[str, str], bool]:
    """accepts(grammar, text): whether a matcher on the tiny model's tokenizer takes the text
    and may stop there."""
    tokenizer: Any = AutoTokenizer.from_pretrained(tiny_model_dir)
    vocab_size = json.loads((tiny_model_dir / "config.json").read_text())["vocab_size"]
    ll_tokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size)

    def check(grammar: str, text: str) -> bool:
        matcher = llguidance.LLMatcher(ll_tokenizer, grammar, log_level=0)
        # The text as a model writes it: "<|im_end|>" inside a string is characters, not EOS.
        ids = tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True)
        return matcher.consume_tokens(ids) and matcher.is_accepting() and not matcher.is_error()

    return check


def _grammar(functions: list[FunctionSpec], *, parallel: bool) -> str:
    grammar = llguidance.grammar_from("lark", tool_call_grammar(functions, parallel=parallel))
    assert llguidance.LLMatcher.validate_grammar(grammar, None) == ""
    return grammar


def test_grammar_shape() -> None:
    text = tool_call_grammar([NOOP], parallel=True)
    assert text.splitlines()[:2] == [
        'start: call ("\\n" call)*',
        'call: "<tool_call>\\n" body "\\n</tool_call>"',
    ]
    schema = json.loads(text.splitlines()[2].removeprefix("body: %json "))
    assert schema == {
        "x-guidance": {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "},
        "anyOf": [
            {
                "type": "object",
                "properties": {"name": {"const": "noop"}, "arguments": {"type": "object"}},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
        ],
    }
    assert tool_call_grammar([NOOP], parallel=False).startswith("start: call\n")


def test_grammar_accepts_template_calls_and_the_parser_reads_them_back(
    accepts: Callable[[str, str], bool],
) -> None:
    single, parallel = _grammar(FUNCTIONS, parallel=False), _grammar(FUNCTIONS, parallel=True)
    for name, arguments in GOOD_CALLS:
        text = call_text(name, arguments)
        assert accepts(single, text), text
        assert accepts(parallel, text), text
        assert accepts(_grammar([f for f in FUNCTIONS if f.name == name], parallel=False), text)
    several = "\n".join(call_text(name, arguments) for name, arguments in GOOD_CALLS)
    assert accepts(parallel, several)
    assert accepts(single, call_text("noop", {"a": "<|im_end|> </tool_call> <tool_call>"}))
    _, calls, rest = parse([several])
    assert [(c.name, json.loads(c.arguments)) for c in calls] == GOOD_CALLS
    assert rest == "\n" * (len(GOOD_CALLS) - 1)


def test_grammar_accepts_what_the_chat_template_writes(
    tiny_model_dir: Path, accepts: Callable[[str, str], bool]
) -> None:
    tokenizer: Any = AutoTokenizer.from_pretrained(tiny_model_dir)
    tool_calls = [{"function": {"name": n, "arguments": a}} for n, a in GOOD_CALLS]
    messages = [{"role": "assistant", "content": None, "tool_calls": tool_calls}]
    rendered = tokenizer.apply_chat_template(messages, tokenize=False)
    written = rendered.removeprefix("<|im_start|>assistant\n").removesuffix("<|im_end|>\n")
    assert accepts(_grammar(FUNCTIONS, parallel=True), written)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        (call_text("get_wether", {"city": "x"}), "unknown name"),
        (call_text("get_weather", {"days": 3}), "missing required property"),
        (call_text("get_weather", {"city": 3}), "wrong type"),
        (call_text("get_weather", {"city": "x", "days": 0}), "below minimum"),
        (call_text("get_weather", {"city": "x", "wind": 1}), "additional property"),
        (call_text("get_weather", {"days": 3, "city": "x"}), "properties out of schema order"),
        (call_text("plant-tree", {"root": {"label": "a", "kids": [{}]}}), "bad nested $ref"),
        ("Sure! " + call_text("noop", {}), "text before the call"),
        (call_text("noop", {}) + " done", "text after the call"),
        (call_text("noop", {}) + "\n" + call_text("noop", {}), "a second call"),
        (f'{OPEN_TAG}\n{{"name":"noop","arguments":{{}}}}\n{CLOSE_TAG}', "no spaces"),
        (f'{OPEN_TAG}\n{{"name":  "noop", "arguments": {{}}}}\n{CLOSE_TAG}', "two spaces"),
        (f'{OPEN_TAG}\n{{"name": "noop", "arguments": {{}} }}\n{CLOSE_TAG}', "a trailing space"),
        (f'{OPEN_TAG}{{"name": "noop", "arguments": {{}}}}{CLOSE_TAG}', "no newlines"),
        (call_text("noop", {"a": "\\u00e9"}).replace("\\\\", "\\"), "a printable \\u escape"),
    ],
)
def test_grammar_rejects(accepts: Callable[[str, str], bool], text: str, why: str) -> None:
    assert not accepts(_grammar(FUNCTIONS, parallel=False), text), why


# llguidance's JSON strings refuse a raw U+007F (json.dumps writes it as is; "\\u007f" passes).
_GRAMMAR_TEXT = st.text(st.characters(codec="utf-8", exclude_characters="\x7f"))
_GRAMMAR_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | _GRAMMAR_TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_GRAMMAR_TEXT, inner, max_size=3),
    max_leaves=8,
)  # fmt: skip


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(arguments=st.dictionaries(_GRAMMAR_TEXT, _GRAMMAR_JSON, max_size=4))
def test_grammar_takes_any_object_as_json_dumps_writes_it(
    accepts: Callable[[str, str], bool], arguments: dict[str, Any]
) -> None:
    text = call_text("noop", arguments)
    assert accepts(_grammar([NOOP], parallel=False), text)
    _, calls, _ = parse([text])
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("noop", arguments)]


def test_parallel_grammar_takes_one_newline_between_calls(
    accepts: Callable[[str, str], bool],
) -> None:
    grammar = _grammar([NOOP], parallel=True)
    call = call_text("noop", {})
    assert accepts(grammar, call + "\n" + call + "\n" + call)
    assert not accepts(grammar, call + "\n\n" + call)
    assert not accepts(grammar, call + call)
    assert not accepts(grammar, "")


def test_function_names() -> None:
    for name in ["a", "get_weather", "A-9_z", "x" * 64]:
        check_function_name(name)
    for name in ["", "x" * 65, "get weather", "get.weather", "é", 'a"b', "a\n"]:
        with pytest.raises(ValueError, match=r"function\.name"):
            check_function_name(name, field="tools[0].function.name")
    with pytest.raises(ValueError, match=r"functions\[1\]\.name"):
        tool_call_grammar([NOOP, FunctionSpec("bad name")], parallel=False)
    with pytest.raises(ValueError, match="functions"):
        tool_call_grammar([], parallel=True)
