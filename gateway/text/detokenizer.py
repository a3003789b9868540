"""Incremental detokenization: token ids in, text out, never splitting a multi-byte character.

Invariant: after `finish()`, the concatenation of everything returned equals
`tokenizer.decode(all_token_ids)` (special tokens skipped), exactly.

- Byte-level tokenizers: each token is a run of bytes; an incremental UTF-8 decoder holds an
  incomplete trailing character back until its last byte arrives, and replaces invalid bytes the
  way a full decode does.
- Other tokenizers (SentencePiece-style): vLLM's windowed scheme. The text of a short window of
  recent tokens is decoded with and without the new tokens; the difference is emitted unless it
  ends in U+FFFD (an incomplete character), in which case it waits for more tokens.
"""

from __future__ import annotations

import codecs
from typing import Protocol

from gateway.text.tokenizer import Tokenizer

# How many earlier tokens the generic scheme re-decodes as context (vLLM's choice).
_WINDOW = 5


class Detokenizer(Protocol):
    def add(self, token_id: int) -> str:
        """The text this token completes (possibly empty)."""
        ...

    def finish(self) -> str:
        """Whatever is still held back (an incomplete character becomes U+FFFD)."""
        ...


class ByteDetokenizer:
    def __init__(self, table: list[bytes | None]) -> None:
        self._table = table
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def add(self, token_id: int) -> str:
        raw = self._table[token_id] if 0 <= token_id < len(self._table) else None
        if raw is None:
            return ""
        text: str = self._decoder.decode(raw)
        return text

    def finish(self) -> str:
        text: str = self._decoder.decode(b"", final=True)
        return text


class WindowDetokenizer:
    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self._ids: list[int] = []
        self._prefix_offset = 0  # start of the context window
        self._read_offset = 0  # tokens before this are emitted
        self._emitted: list[str] = []

    def add(self, token_id: int) -> str:
        self._ids.append(token_id)
        decode = self._tokenizer.decode
        prefix = decode(self._ids[self._prefix_offset : self._read_offset])
        full = decode(self._ids[self._prefix_offset :])
        if len(full) <= len(prefix) or full.endswith("\ufffd"):
            return ""
        new = full[len(prefix) :]
        self._prefix_offset = max(self._read_offset, len(self._ids) - _WINDOW)
        self._read_offset = len(self._ids)
        self._emitted.append(new)
        return new

    def finish(self) -> str:
        # Whatever the windows missed: the full decode is the reference.
        full = self._tokenizer.decode(self._ids)
        done = "".join(self._emitted)
        return full[len(done) :] if full.startswith(done) else ""


def make_detokenizer(tokenizer: Tokenizer) -> Detokenizer:
    if tokenizer.token_bytes is not None:
        return ByteDetokenizer(tokenizer.token_bytes)
    return WindowDetokenizer(tokenizer)
