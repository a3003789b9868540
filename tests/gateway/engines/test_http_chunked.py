"""The chunked transfer decoder of the engine client (gateway/engines/http_chunked.py), without
sockets: any split of the bytes decodes to the same body; broken coding is a ValueError; what
follows the body's end is kept apart (the connection is then not reused)."""

from __future__ import annotations

import random

import pytest

from gateway.engines.http_chunked import MAX_LINE_BYTES, ChunkedDecoder


def _encode(pieces: list[bytes], *, extension: bytes = b"", trailers: bytes = b"") -> bytes:
    body = b"".join(b"%x%s\r\n%s\r\n" % (len(p), extension, p) for p in pieces if p)
    return body + b"0\r\n" + trailers + b"\r\n"


def _decode(wire: bytes, cuts: list[int]) -> tuple[bytes, ChunkedDecoder]:
    decoder, out, last = ChunkedDecoder(), [], 0
    for cut in [*sorted(cuts), len(wire)]:
        decoder.feed(wire[last:cut])
        out.extend((decoder.take(1), decoder.take()))
        last = cut
    return b"".join(out), decoder


EVENTS = [b'data: {"choices":[{"index":0,"token_ids":[%d]}]}\n\n' % i for i in range(12)]


@pytest.mark.parametrize("seed", range(40))
def test_any_split_of_the_bytes_decodes_to_the_same_body(seed: int) -> None:
    rng = random.Random(seed)
    extension = rng.choice([b"", b";name=value", b" ; x"])
    trailers = rng.choice([b"", b"x-trailer: 1\r\n"])
    wire = _encode(EVENTS, extension=extension, trailers=trailers)
    cuts = rng.sample(range(1, len(wire)), k=rng.randint(0, min(60, len(wire) - 1)))
    body, decoder = _decode(wire, cuts)
    assert body == b"".join(EVENTS)
    assert decoder.done and decoder.leftover == b""


def test_byte_by_byte_and_all_at_once() -> None:
    wire = _encode(EVENTS)
    body, decoder = _decode(wire, list(range(1, len(wire))))
    assert body == b"".join(EVENTS) and decoder.done
    whole = ChunkedDecoder()
    whole.feed(wire)
    assert whole.take() == b"".join(EVENTS) and whole.done


def test_take_stops_once_that_many_chunks_are_whole() -> None:
    decoder = ChunkedDecoder()
    decoder.feed(_encode(EVENTS))
    assert decoder.take(1) == EVENTS[0]
    assert decoder.take(2) == EVENTS[1] + EVENTS[2]
    assert decoder.take() == b"".join(EVENTS[3:]) and decoder.done


def test_the_body_is_not_done_until_the_last_chunk_and_its_blank_line() -> None:
    wire = _encode([b"abc"])
    decoder = ChunkedDecoder()
    decoder.feed(wire[:-2])
    assert decoder.take() == b"abc"
    assert not decoder.done
    decoder.feed(wire[-2:])
    assert decoder.take() == b"" and decoder.done


def test_bytes_after_the_body_are_kept_apart() -> None:
    decoder = ChunkedDecoder()
    decoder.feed(_encode([b"abc"]) + b"HTTP/1.1 200 OK\r\n")
    assert decoder.take() == b"abc"
    assert decoder.done and decoder.leftover == b"HTTP/1.1 200 OK\r\n"


@pytest.mark.parametrize(
    "wire",
    [
        b"zz\r\nabc\r\n",  # not hexadecimal
        b"-3\r\nabc\r\n",  # a sign
        b"0x3\r\nabc\r\n",  # a prefix
        b"1_0\r\n",  # an underscore, which int() would take
        b"\r\n",  # no size
        b"3\r\nabcXY",  # data not ended by CRLF
        b"1" * 16 + b"\r\n",  # more than 15 hex digits
    ],
)
def test_broken_coding_is_a_value_error(wire: bytes) -> None:
    decoder = ChunkedDecoder()
    decoder.feed(wire)
    with pytest.raises(ValueError):
        decoder.take()


def test_a_size_line_or_trailer_without_end_is_bounded() -> None:
    decoder = ChunkedDecoder()
    decoder.feed(b"3" + b" " * (MAX_LINE_BYTES - 10))
    assert decoder.take() == b""  # not too long yet
    decoder.feed(b" " * 64)
    with pytest.raises(ValueError):
        decoder.take()
    trailers = ChunkedDecoder()
    trailers.feed(b"0\r\n")
    assert trailers.take() == b""
    trailers.feed(b"x-long: " + b"a" * (MAX_LINE_BYTES + 1) + b"\r\n")
    with pytest.raises(ValueError):
        trailers.take()
