"""One chat choice's answer read for tool calls: as streamed deltas, and as a whole message.

Both forms come from one `ToolCallParser` over the same text (tool_calls.py: its events do not
depend on where the text was cut), and content is the text outside calls with its leading and
trailing whitespace dropped (the "\\n" a template puts between text and calls): the stream
holds back whitespace until text follows it. Invariant: the deltas of a stream, assembled as
the OpenAI SDK assembles them, equal the whole response's message.
"""

from __future__ import annotations

from typing import Any

from gateway.openai.tool_calls import (
    ArgumentsPiece,
    CallStart,
    Event,
    TextPiece,
    ToolCallParser,
    new_call_id,
)

JSON = dict[str, Any]


class ChoiceTools:
    def __init__(self) -> None:
        self._parser = ToolCallParser(new_id=new_call_id)
        self._started = False  # non-whitespace content has been sent
        self._held = ""  # whitespace not sent yet: sent only if more content follows

    @property
    def has_calls(self) -> bool:
        return bool(self._parser.calls)

    # ---- streamed ------------------------------------------------------------------------------

    def stream(self, text: str, *, final: bool) -> tuple[str, list[JSON]]:
        """Content and `delta.tool_calls` entries for `text`; `final` flushes the parser."""
        events = self._parser.feed(text) if text else []
        if final:
            events += self._parser.finish()
        content: list[str] = []
        calls: list[JSON] = []
        for event in events:
            if isinstance(event, TextPiece):
                content.append(self._content(event.text))
            elif isinstance(event, CallStart):
                calls.append(
                    {
                        "index": event.index,
                        "id": event.id,
                        "type": "function",
                        "function": {"name": event.name, "arguments": ""},
                    }
                )
            elif isinstance(event, ArgumentsPiece):
                if calls and calls[-1]["index"] == event.index:
                    calls[-1]["function"]["arguments"] += event.text
                else:
                    calls.append({"index": event.index, "function": {"arguments": event.text}})
        return "".join(content), calls

    def _content(self, text: str) -> str:
        text = self._held + text
        if not self._started:
            text = text.lstrip()
            self._started = bool(text)
        body = text.rstrip()
        self._held = text[len(body) :]
        return body

    # ---- whole ---------------------------------------------------------------------------------

    def message(self, text: str) -> tuple[str | None, list[JSON]]:
        """content and tool_calls of the whole answer `text` (fed to a fresh parser)."""
        events: list[Event] = self._parser.feed(text) + self._parser.finish()
        del events  # the parser keeps what they said: calls and text
        calls = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments},
            }
            for call in self._parser.calls
        ]
        content = self._parser.text.strip()
        return (content or (None if calls else "")), calls
