"""Helpers of the tool-call tests: parse a text in chunks, write a call as the template does."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterable
from typing import Any

from gateway.openai.tool_calls import (
    CLOSE_TAG,
    OPEN_TAG,
    ArgumentsPiece,
    CallStart,
    Event,
    TextPiece,
    ToolCall,
    ToolCallParser,
)


def call_ids() -> Callable[[], str]:
    counter = itertools.count()
    return lambda: f"call_{next(counter)}"


def joined(events: Iterable[Event]) -> list[Event]:
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


def parse(chunks: Iterable[str]) -> tuple[list[Event], list[ToolCall], str]:
    parser = ToolCallParser(new_id=call_ids())
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
    return joined(events), parser.calls, parser.text


def call_text(name: str, arguments: Any) -> str:
    """A call as the chat template writes it (json.dumps's layout: ", " and ": ")."""
    args = json.dumps(arguments, ensure_ascii=False)
    return f'{OPEN_TAG}\n{{"name": {json.dumps(name)}, "arguments": {args}}}\n{CLOSE_TAG}'
