"""HTTP/1.1 chunked transfer coding, decoded from whatever bytes each read brings.

An engine streams a request's events as chunks, often several in one TCP read (a step's tokens,
the usage event and `[DONE]` together). Read a chunk at a time (a size line, then the data),
that cost two awaits on the stream reader and a generator hop per event; decoded from the
buffer, it is one await per read, and the events of one read reach the reader in two pieces:
the first chunk alone (a stream's first bytes go out before the rest of a burst is decoded),
then the rest together.

Plain Python over bytes, no I/O: http_wire.Response feeds it what it reads.
"""

from __future__ import annotations

import re

# A size line: 1-15 hex digits, maybe extensions (ignored), CRLF.
_SIZE_LINE = re.compile(rb"([0-9A-Fa-f]{1,15})[ \t]*(?:;[^\r\n]*)?\r\n")
# A size line (with its extensions) or a trailer field longer than this is not from an engine.
MAX_LINE_BYTES = 8192

_SIZE, _DATA, _DATA_END, _TRAILER = range(4)


class ChunkedDecoder:
    def __init__(self) -> None:
        self._buf = b""  # bytes not decoded yet: a partial line, or a chunk's CRLF
        self._state = _SIZE
        self._left = 0  # data bytes of the current chunk still to come
        self.done = False  # the last chunk and the trailers have been read
        self.leftover = b""  # bytes after the body's end (a peer that sent more than it said)

    def feed(self, data: bytes) -> None:
        """Add what a read brought; `take` decodes it."""
        self._buf = self._buf + data if self._buf else data

    def take(self, max_chunks: int | None = None) -> bytes:
        """The body's bytes the fed bytes complete (maybe none), stopping once `max_chunks`
        chunks' data is whole (None: all there is); ValueError where the coding is broken.
        After `done`, nothing more is expected."""
        buf = self._buf
        out: list[bytes] = []
        pos, end, whole = 0, len(buf), 0
        while not self.done and whole != max_chunks:
            if self._state == _DATA:
                take = min(self._left, end - pos)
                if take == 0:
                    break
                out.append(buf[pos : pos + take])
                pos += take
                self._left -= take
                if self._left:
                    break
                self._state = _DATA_END
                whole += 1
            elif self._state == _DATA_END:
                if end - pos < 2:
                    break
                if buf[pos : pos + 2] != b"\r\n":
                    raise ValueError("a chunk's data does not end in CRLF")
                pos += 2
                self._state = _SIZE
            elif self._state == _SIZE:
                match = _SIZE_LINE.match(buf, pos)
                if match is None:
                    if buf.find(b"\r\n", pos) >= 0:
                        raise ValueError("a malformed chunk size line")
                    if end - pos > MAX_LINE_BYTES:
                        raise ValueError("an oversized chunk size line")
                    break
                if match.end() - pos > MAX_LINE_BYTES:
                    raise ValueError("an oversized chunk size line")
                size = int(match[1], 16)
                pos = match.end()
                if size == 0:
                    self._state = _TRAILER
                elif end - pos >= size + 2:  # the whole chunk is here: the usual case
                    if buf[pos + size : pos + size + 2] != b"\r\n":
                        raise ValueError("a chunk's data does not end in CRLF")
                    out.append(buf[pos : pos + size])
                    pos += size + 2
                    whole += 1
                else:
                    self._left = size
                    self._state = _DATA
            else:  # trailer fields, up to a blank line
                line_end = buf.find(b"\r\n", pos)
                if (line_end if line_end >= 0 else end) - pos > MAX_LINE_BYTES:
                    raise ValueError("an oversized trailer")
                if line_end < 0:
                    break
                if line_end == pos:
                    self.done = True
                    self.leftover = buf[pos + 2 :]
                    pos = end
                else:
                    pos = line_end + 2  # a trailer field: nothing the gateway reads
        self._buf = buf[pos:]
        return b"".join(out) if len(out) != 1 else out[0]
