"""The Responses API's answer: the `Response` object, whole or as its stream of typed events.

`OutputItems` turns the answer's text into output items as it arrives: a `message` item for
text, a `function_call` item for each tool call read out of it (tool_calls.py), in the order
the model wrote them. Both paths run it over the same deltas; streamed, each step's events are
sent, whole, they are dropped and the items read at the end. Invariant: the events of a
stream, assembled as the OpenAI SDK assembles them, equal the whole response (ids aside).

A stream, as `event: <type>` / `data: <json>` pairs whose `sequence_number` counts from 0:

    response.created, response.in_progress               (output [], status in_progress)
    a message:  response.output_item.added, response.content_part.added,
                response.output_text.delta ..., response.output_text.done,
                response.content_part.done, response.output_item.done
    a call:     response.output_item.added (arguments ""),
                response.function_call_arguments.delta ...,
                response.function_call_arguments.done, response.output_item.done
    response.completed, or response.incomplete (cut by max_output_tokens), carrying the whole
    Response with its usage; after an engine failure, response.failed (status failed, error)

Each item is done before the next is added. With tools, text around calls loses its leading and
trailing whitespace (chat's rule, tool_output.py); text that is only whitespace makes no item.
An answer with no item at all gets one empty message, so `output_text` is "".
"""

from __future__ import annotations

import copy
import json
import uuid
from typing import Any

from gateway.openai.text_output import TextOutput
from gateway.openai.tool_calls import CallStart, Event, TextPiece, ToolCallParser, new_call_id
from gateway.text.choices import ChoiceDelta
from gateway.text.tokenizer import Tokenizer

JSON = dict[str, Any]
ItemEvent = tuple[str, JSON]  # (type, the event's fields but type and sequence_number)

# The finish reason of the answer -> the Response's status and incomplete_details.
_STATUS: dict[str, tuple[str, JSON | None]] = {
    "stop": ("completed", None),
    "length": ("incomplete", {"reason": "max_output_tokens"}),
}
_CUT = ("incomplete", None)  # aborted (the engine ended it without a reason)
_NUM_HEAD_EVENTS = 2  # response.created, response.in_progress


def new_item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def _text_part(text: str) -> JSON:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


class OutputItems:
    def __init__(self, *, reads_calls: bool) -> None:
        self.items: list[JSON] = []  # as the Response lists them; the last may be open
        self._parser = ToolCallParser(new_id=new_call_id) if reads_calls else None
        self._open: JSON | None = None  # the item being written
        self._pieces: list[str] = []  # its text (a message) or arguments (a call)
        self._held = ""  # a message's trailing whitespace, sent only if more text follows

    def feed(self, text: str) -> list[ItemEvent]:
        if self._parser is None:
            return self._text(text, strip=False)
        return self._parsed(self._parser.feed(text))

    def finish(self, status: str) -> list[ItemEvent]:
        """The answer is complete: held-back text out, the open item done with `status`."""
        events = [] if self._parser is None else self._parsed(self._parser.finish())
        events += self._close(status)
        if not self.items:
            events += self._open_message() + self._close(status)
        return events

    def cut(self) -> None:
        """The answer failed: the open item ends incomplete, with no events."""
        self._close("incomplete")

    # ---- events -> items ---------------------------------------------------------------------

    def _parsed(self, events: list[Event]) -> list[ItemEvent]:
        out: list[ItemEvent] = []
        for event in events:
            if isinstance(event, TextPiece):
                out += self._text(event.text, strip=True)
            elif isinstance(event, CallStart):
                out += self._close("completed") + self._open_call(event)
            else:
                out += self._delta("response.function_call_arguments.delta", event.text)
        return out

    def _text(self, text: str, *, strip: bool) -> list[ItemEvent]:
        events: list[ItemEvent] = []
        if self._open is not None and self._open["type"] == "function_call":
            events += self._close("completed")  # text after a call: its block has ended
        if strip:
            if self._open is None:
                text = text.lstrip()
            text = self._held + text
            kept = text.rstrip()
            self._held, text = text[len(kept) :], kept
        if not text:
            return events
        if self._open is None:
            events += self._open_message()
        return events + self._delta("response.output_text.delta", text)

    def _delta(self, kind: str, text: str) -> list[ItemEvent]:
        item = self._open
        assert item is not None  # the parser's arguments come after their call's start
        self._pieces.append(text)
        fields: JSON = {"item_id": item["id"], "output_index": len(self.items) - 1}
        if kind == "response.output_text.delta":
            fields.update(content_index=0, delta=text, logprobs=[])
        else:
            fields["delta"] = text
        return [(kind, fields)]

    def _open_message(self) -> list[ItemEvent]:
        item = {
            "type": "message",
            "id": new_item_id("msg"),
            "status": "in_progress",
            "role": "assistant",
            "content": [],
        }
        where = {"item_id": item["id"], "output_index": len(self.items)}
        return [
            *self._add(item),
            ("response.content_part.added", {**where, "content_index": 0, "part": _text_part("")}),
        ]

    def _open_call(self, start: CallStart) -> list[ItemEvent]:
        item = {
            "type": "function_call",
            "id": new_item_id("fc"),
            "call_id": start.id,
            "name": start.name,
            "arguments": "",
            "status": "in_progress",
        }
        return self._add(item)

    def _add(self, item: JSON) -> list[ItemEvent]:
        self.items.append(item)
        self._open, self._pieces = item, []
        added = {"output_index": len(self.items) - 1, "item": copy.deepcopy(item)}
        return [("response.output_item.added", added)]

    def _close(self, status: str) -> list[ItemEvent]:
        item = self._open
        if item is None:
            return []
        self._open, self._held = None, ""
        item["status"] = status
        text = "".join(self._pieces)
        where = {"item_id": item["id"], "output_index": len(self.items) - 1}
        events: list[ItemEvent]
        if item["type"] == "message":
            item["content"] = [_text_part(text)]
            events = [
                ("response.output_text.done", {**where, "content_index": 0, "text": text,
                                               "logprobs": []}),
                ("response.content_part.done", {**where, "content_index": 0,
                                                "part": _text_part(text)}),
            ]  # fmt: skip
        else:
            item["arguments"] = text
            events = [
                ("response.function_call_arguments.done",
                 {**where, "name": item["name"], "arguments": text}),
            ]  # fmt: skip
        events.append(
            ("response.output_item.done", {"output_index": where["output_index"],
                                           "item": copy.deepcopy(item)})
        )  # fmt: skip
        return events


class ResponseRenderer:
    """text_output.Renderer for one answer (the Responses API has no `n`)."""

    def __init__(
        self, *, response_id: str, model: str, created_at: int, echo: JSON, reads_calls: bool
    ) -> None:
        self._head = {
            "id": response_id,
            "object": "response",
            "created_at": created_at,
            "model": model,
        }
        self._echo = echo
        self._items = OutputItems(reads_calls=reads_calls)
        self._finish_reason: str | None = None
        # The run renders the first engine event before it asks for the head, which goes out
        # first: the head's two events hold 0 and 1 whenever they are made.
        self._sequence = _NUM_HEAD_EVENTS

    def _status(self) -> tuple[str, JSON | None]:
        return _STATUS.get(self._finish_reason or "abort", _CUT)

    def _step(self, deltas: list[ChoiceDelta]) -> list[ItemEvent]:
        events: list[ItemEvent] = []
        for d in deltas:
            if d.finish_reason == "error":
                continue  # the engine failed: stream_failure tells the client
            if d.text:
                events += self._items.feed(d.text)
            if d.finish_reason is not None:
                self._finish_reason = d.finish_reason
        return events

    def _finish(self) -> list[ItemEvent]:
        status = self._status()[0]
        return self._items.finish("completed" if status == "completed" else "incomplete")

    def response(
        self,
        output: TextOutput | None,
        *,
        status: str | None = None,
        error: JSON | None = None,
    ) -> JSON:
        """The Response object: in progress (no output yet) without `output`."""
        details = None
        if status is None:
            status, details = self._status() if output is not None else ("in_progress", None)
        return {
            **self._head,
            "status": status,
            "error": error,
            "incomplete_details": details,
            **self._echo,
            "output": [] if output is None else copy.deepcopy(self._items.items),
            "usage": None if output is None else _usage(output),
        }

    # ---- whole ---------------------------------------------------------------------------------

    def add(self, deltas: list[ChoiceDelta]) -> None:
        self._step(deltas)

    def body(self, output: TextOutput) -> JSON:
        self._finish()
        return self.response(output)

    # ---- streamed ------------------------------------------------------------------------------

    def _sse(self, kind: str, fields: JSON, sequence: int | None = None) -> bytes:
        if sequence is None:
            sequence, self._sequence = self._sequence, self._sequence + 1
        payload = {"type": kind, "sequence_number": sequence, **fields}
        data = json.dumps(payload, separators=(",", ":"))
        return f"event: {kind}\ndata: {data}\n\n".encode()

    def stream_start(self, output: TextOutput) -> list[bytes]:
        created = self.response(None)
        return [
            self._sse("response.created", {"response": created}, 0),
            self._sse("response.in_progress", {"response": created}, 1),
        ]

    def stream_deltas(self, deltas: list[ChoiceDelta]) -> list[bytes]:
        return [self._sse(kind, fields) for kind, fields in self._step(deltas)]

    def stream_end(self, output: TextOutput) -> list[bytes]:
        chunks = [self._sse(kind, fields) for kind, fields in self._finish()]
        response = self.response(output)
        kind = "response.completed" if response["status"] == "completed" else "response.incomplete"
        return [*chunks, self._sse(kind, {"response": response})]

    def stream_failure(self, output: TextOutput, message: str) -> bytes:
        self._items.cut()
        error = {"code": "server_error", "message": message}
        response = self.response(output, status="failed", error=error)
        return self._sse("response.failed", {"response": response})


def _usage(output: TextOutput) -> JSON:
    prompt, completion = output.num_prompt_tokens, output.num_completion_tokens
    return {
        "input_tokens": prompt,
        # cache_write_tokens: writes billed apart (OpenAI's explicit caching); none here
        "input_tokens_details": {
            "cached_tokens": output.num_cached_tokens,
            "cache_write_tokens": 0,
        },
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + completion,
    }


class ResponseOutput(TextOutput):
    """chat's TextOutput for one answer, whose failure after the stream started is a
    `response.failed` event: chat's error chunk and `[DONE]` are no part of this API."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        renderer: ResponseRenderer,
        *,
        prompts: list[list[int]],
        stops: tuple[str, ...],
        include_stop: bool,
        stream: bool,
    ) -> None:
        super().__init__(
            tokenizer,
            renderer,
            prompts=prompts,
            n=1,
            stops=stops,
            include_stop=include_stop,
            want_logprobs=False,
            stream=stream,
        )
        self._responses = renderer

    def failure(self, message: str) -> bytes:
        return self._responses.stream_failure(self, message)
