"""Tool calls read out of generated text in the Hermes / Qwen2.5 format, as the text arrives.

A model that was shown tools (engine/make_model/tokenizer.py's chat template) answers with
ordinary text and blocks of the form

    <tool_call>
    {"name": "NAME", "arguments": {...}}
    </tool_call>

`ToolCallParser` is a character-level state machine over that text: each character moves it on,
and what it emits depends only on the characters seen so far, never on where the chunks were
cut. Invariant: any chunking of one text yields the same events once adjacent pieces of one
kind are joined, and the same `calls` and `text`, so a streamed response assembled from its
deltas equals the whole response.

A call is announced (`CallStart`) once its name is known and its arguments value begins; the
arguments then stream as the model writes them. A block that leaves that shape before then is
read whole when it closes (`json.loads`, any key order, arguments given back as compact JSON)
and, if it is no call, given back as text with its tags. Once a call has started it stands:
what follows its arguments up to `</tool_call>` is dropped, whatever it is. Text between and
around calls (often a bare "\n") is kept in `text` as written; whether whitespace-only text
counts as content is the caller's choice.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum, auto
from typing import Any

OPEN_TAG = "<tool_call>"
CLOSE_TAG = "</tool_call>"

_WS = "[ \t\n\r]*"  # JSON's whitespace (re's \s would take any Unicode space)
# A well-formed block's start, up to the first character of its arguments value; group 1 is
# the name as a JSON string. Arguments written as a JSON string (JSON text inside a string) do
# not match: they are read whole, which unwraps them, so both paths give the JSON text meant.
_HEADER = re.compile(
    rf'{_WS}\{{{_WS}"name"{_WS}:{_WS}("(?:[^"\\\x00-\x1f]|\\.)*"){_WS},'
    rf'{_WS}"arguments"{_WS}:{_WS}[{{\[\-0-9tfn]'
)
# Past this length a block without a call is only read whole at </tool_call>: matching the
# header again after every character would cost quadratic time in a runaway name string.
_MAX_HEADER_CHARS = 1024
# A bare scalar ends before any of these; `<` too, as no JSON holds it outside a string.
_SCALAR_ENDS = frozenset(" \t\n\r,}]<")


@dataclass(frozen=True)
class ToolCall:
    index: int
    id: str
    name: str
    arguments: str  # the JSON text as the model wrote it (compact JSON when read whole)


@dataclass(frozen=True)
class TextPiece:
    text: str


@dataclass(frozen=True)
class CallStart:
    index: int
    id: str
    name: str


@dataclass(frozen=True)
class ArgumentsPiece:
    index: int
    text: str


Event = TextPiece | CallStart | ArgumentsPiece


def new_call_id() -> str:
    """OpenAI-style call id: "call_" and 24 URL-safe characters (18 random bytes)."""
    return "call_" + secrets.token_urlsafe(18)


class _State(Enum):
    TEXT = auto()  # outside a block
    HEADER = auto()  # in a block, no call yet: the header may still match
    WHOLE = auto()  # in a block, no call, off-shape: collect it to read it whole
    ARGUMENTS = auto()  # streaming a call's arguments value
    SKIP = auto()  # after the arguments (or where they broke off): drop up to </tool_call>


@dataclass
class _Draft:
    index: int
    id: str
    name: str
    arguments: list[str] = field(default_factory=list)


class ToolCallParser:
    def __init__(self, *, new_id: Callable[[], str]) -> None:
        self._new_id = new_id
        self._state = _State.TEXT
        self._open = _TagFinder(OPEN_TAG)
        self._close = _TagFinder(CLOSE_TAG)
        self._value = _ValueScan()
        self._raw: list[str] = []  # the block after OPEN_TAG, while no call has started
        self._drafts: list[_Draft] = []
        self._text: list[str] = []
        self._events: list[Event] = []
        # Adjacent pieces of one kind leave as one event: (call index, or None for text; parts).
        self._pending: tuple[int | None, list[str]] | None = None

    @property
    def calls(self) -> list[ToolCall]:
        return [ToolCall(d.index, d.id, d.name, "".join(d.arguments)) for d in self._drafts]

    @property
    def text(self) -> str:
        return "".join(self._text)

    def feed(self, text: str) -> list[Event]:
        for char in text:
            self._push(char)
        return self._drain()

    def finish(self) -> list[Event]:
        """End of generation: held-back text and a block whose call never started are text."""
        if self._state is _State.TEXT:
            self._emit_text(self._open.flush())
        elif self._state in (_State.HEADER, _State.WHOLE):
            self._emit_text(OPEN_TAG + "".join(self._raw))
        self._enter_text()
        return self._drain()

    # ---- the state machine -----------------------------------------------------------------

    def _push(self, char: str) -> None:
        if self._state is _State.TEXT:
            released, found = self._open.push(char)
            self._emit_text(released)
            if found:
                self._raw.clear()
                self._state = _State.HEADER
        elif self._state in (_State.HEADER, _State.WHOLE):
            self._push_unstarted(char)
        elif self._state is _State.ARGUMENTS:
            verdict = self._value.push(char)
            if verdict in (_Verdict.MORE, _Verdict.DONE):
                self._emit_arguments(char)
            if verdict is not _Verdict.MORE:
                self._close.reset()
                self._state = _State.SKIP
            if verdict in (_Verdict.AFTER, _Verdict.FAIL):  # the character may begin the tag
                self._push(char)
        else:
            _, found = self._close.push(char)
            if found:
                self._enter_text()

    def _push_unstarted(self, char: str) -> None:
        raw = self._raw
        raw.append(char)
        # </tool_call> ends a block whose call has not started, wherever it comes (even inside
        # an unterminated name string): the model has closed it.
        if char == ">" and "".join(raw[-len(CLOSE_TAG) :]) == CLOSE_TAG:
            self._read_whole("".join(raw[: -len(CLOSE_TAG)]))
        elif self._state is _State.HEADER and len(raw) > _MAX_HEADER_CHARS:
            self._state = _State.WHOLE
        elif self._state is _State.HEADER:
            match = _HEADER.fullmatch("".join(raw))
            name = _loads(match.group(1)) if match else None
            if isinstance(name, str):
                self._start_call(name)
                self._value.start(char)
                self._emit_arguments(char)
                self._state = _State.ARGUMENTS

    def _read_whole(self, block: str) -> None:
        call = _call_from_json(block)
        if call is None:
            self._emit_text(OPEN_TAG + block + CLOSE_TAG)
        else:
            self._start_call(call[0])
            self._emit_arguments(call[1])
        self._enter_text()

    def _enter_text(self) -> None:
        self._open.reset()
        self._state = _State.TEXT

    # ---- events ----------------------------------------------------------------------------

    def _start_call(self, name: str) -> None:
        draft = _Draft(index=len(self._drafts), id=self._new_id(), name=name)
        self._drafts.append(draft)
        self._flush_pending()
        self._events.append(CallStart(index=draft.index, id=draft.id, name=name))

    def _emit_text(self, text: str) -> None:
        if text:
            self._text.append(text)
            self._add_piece(None, text)

    def _emit_arguments(self, text: str) -> None:
        draft = self._drafts[-1]
        draft.arguments.append(text)
        self._add_piece(draft.index, text)

    def _add_piece(self, index: int | None, text: str) -> None:
        if self._pending is not None and self._pending[0] == index:
            self._pending[1].append(text)
            return
        self._flush_pending()
        self._pending = (index, [text])

    def _flush_pending(self) -> None:
        if self._pending is not None:
            index, parts = self._pending
            text = "".join(parts)
            self._events.append(TextPiece(text) if index is None else ArgumentsPiece(index, text))
            self._pending = None

    def _drain(self) -> list[Event]:
        self._flush_pending()
        events, self._events = self._events, []
        return events


def _call_from_json(block: str) -> tuple[str, str] | None:
    """(name, arguments JSON text) when the block is a call object in any layout, else None."""
    obj = _loads(block)
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    arguments = obj.get("arguments")
    if isinstance(arguments, dict):
        return obj["name"], json.dumps(arguments, separators=(",", ":"), ensure_ascii=False)
    if isinstance(arguments, str) and _loads(arguments) is not _NOT_JSON:
        return obj["name"], arguments
    return None


_NOT_JSON = object()


def _loads(text: str) -> Any:
    """Strict JSON (no NaN or Infinity, which clients cannot parse back), or _NOT_JSON."""
    try:
        return json.loads(text, parse_constant=_refuse_constant)
    except ValueError:  # JSONDecodeError is one
        return _NOT_JSON


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


# ---- scanners: each takes one character at a time and keeps what it needs to resume --------


class _Verdict(Enum):
    MORE = auto()  # the character belongs here; not finished
    DONE = auto()  # the character belongs here and finishes it
    AFTER = auto()  # it finished just before the character, which belongs to what follows
    FAIL = auto()  # the character cannot belong here


class _TagFinder:
    """Finds a tag in a character stream, holding back the longest suffix that may begin it."""

    def __init__(self, tag: str) -> None:
        self._tag = tag
        self._held = ""

    def reset(self) -> None:
        self._held = ""

    def flush(self) -> str:
        held, self._held = self._held, ""
        return held

    def push(self, char: str) -> tuple[str, bool]:
        """(the text now known not to begin the tag, whether the tag just completed)."""
        if not self._held and char != self._tag[0]:
            return char, False
        held = self._held + char
        if held == self._tag:
            self._held = ""
            return "", True
        cut = next(i for i in range(len(held) + 1) if self._tag.startswith(held[i:]))
        self._held = held[cut:]
        return held[:cut], False


class _ValueScan:
    """Where a JSON value ends: an object or array where its depth returns to zero (strings
    and their escapes skipped), a bare scalar before the first character that cannot continue
    it. The text is not checked: it streams out as the model wrote it."""

    def __init__(self) -> None:
        self.start("{")

    def start(self, first: str) -> None:
        self._is_scalar = first not in "{["
        self._depth = 0 if self._is_scalar else 1
        self._in_string = False
        self._is_escaped = False

    def push(self, char: str) -> _Verdict:
        if self._is_scalar:
            return _Verdict.AFTER if char in _SCALAR_ENDS else _Verdict.MORE
        if self._in_string:
            if self._is_escaped:
                self._is_escaped = False
            elif char == "\\":
                self._is_escaped = True
            elif char == '"':
                self._in_string = False
            return _Verdict.MORE
        if char == '"':
            self._in_string = True
        elif char in "{[":
            self._depth += 1
        elif char in "}]":
            self._depth -= 1
            return _Verdict.DONE if self._depth == 0 else _Verdict.MORE
        elif char == "<":  # no JSON holds `<` outside a string: the model has gone on to a tag
            return _Verdict.FAIL
        return _Verdict.MORE
