"""Tool calls read out of answers: the streaming parser gives any chunking of a text the same
result as the whole text (the grammar that forces calls: test_tool_grammar.py)."""

from __future__ import annotations

import itertools
import json
import re
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from gateway.openai.tool_calls import (
    CLOSE_TAG,
    OPEN_TAG,
    ArgumentsPiece,
    CallStart,
    TextPiece,
    ToolCall,
    ToolCallParser,
    new_call_id,
)
from tests.gateway.openai.tool_call_helpers import call_ids, call_text, parse

# ---- the parser ---------------------------------------------------------------------------------


def test_reads_a_template_call_and_streams_its_arguments() -> None:
    text = "Sure.\n" + call_text("get_weather", {"city": "Zürich", "q": 'a "}{" b'}) + "\n"
    events, calls, rest = parse([text])
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
    parser = ToolCallParser(new_id=call_ids())
    assert parser.feed(f'{OPEN_TAG}\n{{"name": "f", "arguments": ') == []
    assert parser.feed('{"a"') == [CallStart(0, "call_0", "f"), ArgumentsPiece(0, '{"a"')]


def test_parallel_calls_and_any_whitespace_layout() -> None:
    text = (
        call_text("a", {})
        + "\n"
        + f'{OPEN_TAG}{{ "name" :"b\\"c" ,\n\t"arguments":\n[1, {{"x": []}}] }}  {CLOSE_TAG}'
    )
    _, calls, rest = parse([text])
    assert [(c.name, c.arguments) for c in calls] == [("a", "{}"), ('b"c', '[1, {"x": []}]')]
    assert rest == "\n"


def test_text_that_only_looks_like_a_tag_is_text() -> None:
    text = "a <tool_x> <<tool_call <tool_ </tool_call> b <tool_cal"
    parser = ToolCallParser(new_id=call_ids())
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
    events, calls, rest = parse([text])
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
        _, calls, rest = parse([text])
        assert calls == [ToolCall(0, "call_0", "f", arguments)], text
        assert rest == "z", text


def test_finish_keeps_a_started_call_and_gives_back_an_unstarted_block() -> None:
    _, calls, rest = parse([f'hi {OPEN_TAG}\n{{"name": "f", "arguments": {{"a": [1, '])
    assert calls == [ToolCall(0, "call_0", "f", '{"a": [1, ')] and rest == "hi "
    unstarted = f'hi {OPEN_TAG}\n{{"name": "f", "argu'
    _, calls, rest = parse([unstarted])
    assert calls == [] and rest == unstarted
    _, calls, rest = parse([f'{OPEN_TAG}{{"arguments": {{}}, "name": "f"}}'])  # never closed
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
    whole = parse([text])
    assert parse(data.draw(_chunked(text))) == whole
    assert parse(list(text)) == whole


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_well_formed_calls_are_read_exactly(data: st.DataObject) -> None:
    text, expected_calls, expected_text = data.draw(_document())
    events, calls, rest = parse(data.draw(_chunked(text)))
    assert [(c.name, c.arguments, json.loads(c.arguments)) for c in calls] == expected_calls
    assert [c.id for c in calls] == [f"call_{i}" for i in range(len(calls))]
    assert rest == expected_text
    assert (events, calls, rest) == parse([text])
