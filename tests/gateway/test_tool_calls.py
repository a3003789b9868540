"""Tool calls: the streaming parser (any chunking gives the same result as the whole text) and
the grammar that forces calls (checked with llguidance on a generated model's tokenizer)."""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import llguidance
import llguidance.hf
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from gateway.openai.tool_calls import (
    CLOSE_TAG,
    OPEN_TAG,
    ArgumentsPiece,
    CallStart,
    Event,
    TextPiece,
    ToolCall,
    ToolCallParser,
    new_call_id,
)
from gateway.openai.tool_grammar import FunctionSpec, check_function_name, tool_call_grammar

# ---- helpers ------------------------------------------------------------------------------------


def _ids() -> Callable[[], str]:
    counter = itertools.count()
    return lambda: f"call_{next(counter)}"


def _joined(events: Iterable[Event]) -> list[Event]:
    """Events with adjacent pieces of one kind joined: what any chunking must agree on."""
    out: list[Event] = []
    for event in events:
        last = out[-1] if out else None
        if isinstance(event, TextPiece) and isinstance(last, TextPiece):
            out[-1] = TextPiece(last.text + event.text)
        elif (
            isinstance(event, ArgumentsPiece)
            and isinstance(last, ArgumentsPiece)
            and last.index == event.index
        ):
            out[-1] = ArgumentsPiece(event.index, last.text + event.text)
        else:
            out.append(event)
    return out


def _parse(chunks: Iterable[str]) -> tuple[list[Event], list[ToolCall], str]:
    parser = ToolCallParser(new_id=_ids())
    events: list[Event] = []
    for chunk in chunks:
        events.extend(parser.feed(chunk))
    events.extend(parser.finish())
    # The events and the summaries tell one story.
    texts = "".join(e.text for e in events if isinstance(e, TextPiece))
    starts = [(e.index, e.id, e.name) for e in events if isinstance(e, CallStart)]
    assert texts == parser.text
    assert starts == [(c.index, c.id, c.name) for c in parser.calls]
    for call in parser.calls:
        pieces = [e.text for e in events if isinstance(e, ArgumentsPiece) and e.index == call.index]
        assert "".join(pieces) == call.arguments
    return _joined(events), parser.calls, parser.text


def _call_text(name: str, arguments: Any) -> str:
    """A call as the chat template writes it (json.dumps's layout: ", " and ": ")."""
    args = json.dumps(arguments, ensure_ascii=False)
    return f'{OPEN_TAG}\n{{"name": {json.dumps(name)}, "arguments": {args}}}\n{CLOSE_TAG}'


# ---- the parser ---------------------------------------------------------------------------------


def test_reads_a_template_call_and_streams_its_arguments() -> None:
    text = "Sure.\n" + _call_text("get_weather", {"city": "Zürich", "q": 'a "}{" b'}) + "\n"
    events, calls, rest = _parse([text])
    arguments = '{"city": "Zürich", "q": "a \\"}{\\" b"}'
    assert events == [
        TextPiece("Sure.\n"),
        CallStart(0, "call_0", "get_weather"),
        ArgumentsPiece(0, arguments),
        TextPiece("\n"),
    ]
    assert calls == [ToolCall(0, "call_0", "get_weather", arguments)]
    assert rest == "Sure.\n\n"  # whitespace around calls stays; callers may strip it
    # The call is announced as soon as its arguments begin, before the block is complete.
    parser = ToolCallParser(new_id=_ids())
    assert parser.feed(f'{OPEN_TAG}\n{{"name": "f", "arguments": ') == []
    assert parser.feed('{"a"') == [CallStart(0, "call_0", "f"), ArgumentsPiece(0, '{"a"')]


def test_parallel_calls_and_any_whitespace_layout() -> None:
    text = (
        _call_text("a", {})
        + "\n"
        + f'{OPEN_TAG}{{ "name" :"b\\"c" ,\n\t"arguments":\n[1, {{"x": []}}] }}  {CLOSE_TAG}'
    )
    _, calls, rest = _parse([text])
    assert [(c.name, c.arguments) for c in calls] == [("a", "{}"), ('b"c', '[1, {"x": []}]')]
    assert rest == "\n"


def test_text_that_only_looks_like_a_tag_is_text() -> None:
    text = "a <tool_x> <<tool_call <tool_ </tool_call> b <tool_cal"
    parser = ToolCallParser(new_id=_ids())
    streamed = parser.feed(text)
    assert streamed == [TextPiece("a <tool_x> <<tool_call <tool_ </tool_call> b ")]
    assert parser.finish() == [TextPiece("<tool_cal")]  # held back until the end said "text"
    assert parser.text == text and parser.calls == []


@pytest.mark.parametrize(
    ("block", "name", "arguments"),
    [
        ('{"arguments": {"b": [1, 2], "a": "é"}, "name": "f"}', "f", '{"b":[1,2],"a":"é"}'),
        ('{"name": "f", "arguments": "{\\"a\\": 1}"}', "f", '{"a": 1}'),  # JSON in a string
        ('\n{"name":"f","id":"x","arguments":{}}\n', "f", "{}"),  # an extra key before them
        ('{"name": "f" "arguments": {}}', None, None),  # not JSON: text
        ("not json", None, None),
        ('{"name": 1, "arguments": {}}', None, None),
        ('{"name": "f", "arguments": "not json"}', None, None),
        ('{"name": "f", "arguments": NaN}', None, None),
        ('{"name": "f"}', None, None),
        ('{"name": "f\\q", "arguments": {}}', None, None),  # a bad escape in the name
        ("", None, None),
    ],
)
def test_off_shape_block_is_read_whole_or_given_back(
    block: str, name: str | None, arguments: str | None
) -> None:
    text = f"x{OPEN_TAG}{block}{CLOSE_TAG}y"
    events, calls, rest = _parse([text])
    if name is None:
        assert calls == [] and rest == text
        assert events == [TextPiece(text)]
    else:
        assert calls == [ToolCall(0, "call_0", name, arguments or "")]
        assert rest == "xy"
        assert json.loads(calls[0].arguments) is not None


def test_after_the_call_starts_the_rest_of_the_block_is_dropped() -> None:
    cases = {
        f'{OPEN_TAG}{{"name": "f", "arguments": {{"a": 1}}, "extra": 2}}{CLOSE_TAG}z': '{"a": 1}',
        f'{OPEN_TAG}{{"name": "f", "arguments": {{"a": 1}}{CLOSE_TAG}z': '{"a": 1}',
        f'{OPEN_TAG}{{"name": "f", "arguments": {{"a": 1{CLOSE_TAG}z': '{"a": 1',  # cut short
        f'{OPEN_TAG}{{"name": "f", "arguments": {{"a": "<{CLOSE_TAG}"}}}}{CLOSE_TAG}z': (
            f'{{"a": "<{CLOSE_TAG}"}}'  # a tag inside a string is the string's
        ),
        f'{OPEN_TAG}{{"name": "f", "arguments": -1.5e3}}{CLOSE_TAG}z': "-1.5e3",  # a bare scalar
        f'{OPEN_TAG}{{"name": "f", "arguments": true{CLOSE_TAG}z': "true",
    }
    for text, arguments in cases.items():
        _, calls, rest = _parse([text])
        assert calls == [ToolCall(0, "call_0", "f", arguments)], text
        assert rest == "z", text


def test_finish_keeps_a_started_call_and_gives_back_an_unstarted_block() -> None:
    _, calls, rest = _parse([f'hi {OPEN_TAG}\n{{"name": "f", "arguments": {{"a": [1, '])
    assert calls == [ToolCall(0, "call_0", "f", '{"a": [1, ')] and rest == "hi "
    unstarted = f'hi {OPEN_TAG}\n{{"name": "f", "argu'
    _, calls, rest = _parse([unstarted])
    assert calls == [] and rest == unstarted
    _, calls, rest = _parse([f'{OPEN_TAG}{{"arguments": {{}}, "name": "f"}}'])  # never closed
    assert calls == [] and rest.startswith(OPEN_TAG)


def test_new_call_id() -> None:
    ids = {new_call_id() for _ in range(100)}
    assert len(ids) == 100
    assert all(re.fullmatch(r"call_[A-Za-z0-9_-]{24}", i) for i in ids)


# ---- the parser, over random texts and random chunkings ------------------------------------------

_TRICKY = ["<", ">", "/", "_", "tool", "call", "<tool_", "<tool_call", "</tool_call>", "\n", " "]
_CHARS = st.characters(codec="utf-8")  # any character a str can encode: no lone surrogates
_STRINGS = st.lists(st.sampled_from(['"', "\\", "{", "}", "[", "é", "🙂", *_TRICKY]) | _CHARS).map(
    "".join
)
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | _STRINGS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_STRINGS, inner, max_size=3),
    max_leaves=8,
)
_ARGUMENTS = st.dictionaries(_STRINGS, _JSON, max_size=4)
_NAMES = st.from_regex(r"[a-zA-Z0-9_-]{1,12}", fullmatch=True)
_TEXT = st.lists(st.sampled_from(["a", "é", "🙂", "{", '"', *_TRICKY]) | _CHARS, max_size=12).map(
    "".join
)
_SPACE = st.sampled_from(["", " ", "\n", "  \t"])


@st.composite
def _well_formed_call(draw: st.DrawFn) -> tuple[str, str, str, Any]:
    """(block, name, arguments text, arguments value): any whitespace layout, any separators."""
    name, value = draw(_NAMES), draw(_ARGUMENTS)
    separators = draw(st.sampled_from([(", ", ": "), (",", ":"), (" ,", " : ")]))
    arguments = json.dumps(value, ensure_ascii=draw(st.booleans()), separators=separators)
    s = [draw(_SPACE) for _ in range(10)]
    block = (
        f'{OPEN_TAG}{s[0]}{{{s[1]}"name"{s[2]}:{s[3]}{json.dumps(name)}{s[4]},{s[5]}'
        f'"arguments"{s[6]}:{s[7]}{arguments}{s[8]}}}{s[9]}{CLOSE_TAG}'
    )
    return block, name, arguments, value


@st.composite
def _document(draw: st.DrawFn) -> tuple[str, list[tuple[str, str, Any]], str]:
    """Text and well-formed calls interleaved: (whole, [(name, arguments, value)], text)."""
    parts: list[str] = []
    calls: list[tuple[str, str, Any]] = []
    texts: list[str] = []
    for _ in range(draw(st.integers(0, 4))):
        text = draw(_TEXT)
        block, name, arguments, value = draw(_well_formed_call())
        parts += [text, block]
        texts.append(text)
        calls.append((name, arguments, value))
    tail = draw(_TEXT)
    whole = "".join([*parts, tail])
    assume(whole.count(OPEN_TAG) == len(calls))  # the text parts do not make a tag between them
    return whole, calls, "".join([*texts, tail])


@st.composite
def _any_block(draw: st.DrawFn) -> str:
    """A block well-formed, cut short, read whole, given back as text, or dropped after a start."""
    block, name, arguments, value = draw(_well_formed_call())
    compact = json.dumps(value, ensure_ascii=False)
    return draw(
        st.sampled_from(
            [
                block,
                block[: draw(st.integers(0, len(block)))],  # cut anywhere
                f'{OPEN_TAG}{{"arguments": {arguments}, "name": "{name}"}}{CLOSE_TAG}',
                f'{OPEN_TAG}{{"name": "{name}", "arguments": {json.dumps(compact)}}}{CLOSE_TAG}',
                f'{OPEN_TAG}{{"name": "{name}", "arguments": {arguments}, "x": 1}}{CLOSE_TAG}',
                f'{OPEN_TAG}{{"name": "{name}", "arguments": {arguments[:-1]}<{CLOSE_TAG}',
                f'{OPEN_TAG}{{"name": "{name}", "arguments": 12 }}{CLOSE_TAG}',
                f"{OPEN_TAG}{arguments}{CLOSE_TAG}",
            ]
        )
    )


@st.composite
def _chunked(draw: st.DrawFn, text: str) -> list[str]:
    cuts = sorted(draw(st.sets(st.integers(0, len(text)), max_size=12)))
    return [text[a:b] for a, b in itertools.pairwise([0, *cuts, len(text)])]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_any_chunking_reads_the_same_as_the_whole(data: st.DataObject) -> None:
    text = "".join(data.draw(st.lists(_TEXT | _any_block(), max_size=6)))
    whole = _parse([text])
    assert _parse(data.draw(_chunked(text))) == whole
    assert _parse(list(text)) == whole


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_well_formed_calls_are_read_exactly(data: st.DataObject) -> None:
    text, expected_calls, expected_text = data.draw(_document())
    events, calls, rest = _parse(data.draw(_chunked(text)))
    assert [(c.name, c.arguments, json.loads(c.arguments)) for c in calls] == expected_calls
    assert [c.id for c in calls] == [f"call_{i}" for i in range(len(calls))]
    assert rest == expected_text
    assert (events, calls, rest) == _parse([text])


# ---- the grammar ---------------------------------------------------------------------------------

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
        text = _call_text(name, arguments)
        assert accepts(single, text), text
        assert accepts(parallel, text), text
        assert accepts(_grammar([f for f in FUNCTIONS if f.name == name], parallel=False), text)
    several = "\n".join(_call_text(name, arguments) for name, arguments in GOOD_CALLS)
    assert accepts(parallel, several)
    assert accepts(single, _call_text("noop", {"a": "<|im_end|> </tool_call> <tool_call>"}))
    _, calls, rest = _parse([several])
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
        (_call_text("get_wether", {"city": "x"}), "unknown name"),
        (_call_text("get_weather", {"days": 3}), "missing required property"),
        (_call_text("get_weather", {"city": 3}), "wrong type"),
        (_call_text("get_weather", {"city": "x", "days": 0}), "below minimum"),
        (_call_text("get_weather", {"city": "x", "wind": 1}), "additional property"),
        (_call_text("get_weather", {"days": 3, "city": "x"}), "properties out of schema order"),
        (_call_text("plant-tree", {"root": {"label": "a", "kids": [{}]}}), "bad nested $ref"),
        ("Sure! " + _call_text("noop", {}), "text before the call"),
        (_call_text("noop", {}) + " done", "text after the call"),
        (_call_text("noop", {}) + "\n" + _call_text("noop", {}), "a second call"),
        (f'{OPEN_TAG}\n{{"name":"noop","arguments":{{}}}}\n{CLOSE_TAG}', "no spaces"),
        (f'{OPEN_TAG}\n{{"name":  "noop", "arguments": {{}}}}\n{CLOSE_TAG}', "two spaces"),
        (f'{OPEN_TAG}\n{{"name": "noop", "arguments": {{}} }}\n{CLOSE_TAG}', "a trailing space"),
        (f'{OPEN_TAG}{{"name": "noop", "arguments": {{}}}}{CLOSE_TAG}', "no newlines"),
        (_call_text("noop", {"a": "\\u00e9"}).replace("\\\\", "\\"), "a printable \\u escape"),
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
    text = _call_text("noop", arguments)
    assert accepts(_grammar([NOOP], parallel=False), text)
    _, calls, _ = _parse([text])
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("noop", arguments)]


def test_parallel_grammar_takes_one_newline_between_calls(
    accepts: Callable[[str, str], bool],
) -> None:
    grammar = _grammar([NOOP], parallel=True)
    call = _call_text("noop", {})
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
