"""Incremental detokenization equals a full decode and never splits a multi-byte character;
stop strings are found across token boundaries and never leak a partial stop string."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from gateway.text.detokenizer import ByteDetokenizer, WindowDetokenizer, make_detokenizer
from gateway.text.stop_strings import StopStringFilter
from gateway.text.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Tokenizer:
    return Tokenizer.load(tiny_model_dir)


def _pieces(detok: ByteDetokenizer | WindowDetokenizer, ids: list[int]) -> list[str]:
    return [detok.add(i) for i in ids] + [detok.finish()]


def test_byte_level_table_covers_the_vocabulary(tokenizer: Tokenizer) -> None:
    assert tokenizer.is_byte_level
    assert isinstance(make_detokenizer(tokenizer), ByteDetokenizer)


@pytest.mark.parametrize("kind", ["bytes", "window"])
def test_incremental_equals_full_decode_on_random_ids(tokenizer: Tokenizer, kind: str) -> None:
    rng = random.Random(7)
    for _ in range(300):
        ids = [rng.randrange(tokenizer.num_tokens) for _ in range(rng.randrange(1, 40))]
        detok = (
            ByteDetokenizer(tokenizer.token_bytes or [])
            if kind == "bytes"
            else WindowDetokenizer(tokenizer)
        )
        assert "".join(_pieces(detok, ids)) == tokenizer.decode(ids)


def test_multibyte_characters_are_never_split(tokenizer: Tokenizer) -> None:
    text = "naïve café — 日本語のテキスト 🚀 done"
    ids = tokenizer.encode(text, add_special_tokens=False)
    # Byte-level BPE on a small vocabulary splits these characters over several tokens.
    assert len(ids) > len(text.split())
    pieces = _pieces(ByteDetokenizer(tokenizer.token_bytes or []), ids)
    assert "".join(pieces) == text
    assert all("\ufffd" not in piece for piece in pieces)
    # Some token ended mid-character, so some piece came out empty while waiting for the rest.
    assert "" in pieces[:-1]


def test_special_tokens_are_skipped(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode("<|im_start|>hi<|im_end|>", add_special_tokens=False)
    assert "".join(_pieces(ByteDetokenizer(tokenizer.token_bytes or []), ids)) == "hi"


def _run_stops(
    pieces: list[str], stops: list[str], include: bool = False
) -> tuple[str, str | None]:
    f = StopStringFilter(stops, include_stop=include)
    out = []
    for piece in pieces:
        out.append(f.push(piece))
        if f.hit:
            break
    else:
        out.append(f.flush())
    return "".join(out), f.hit.stop if f.hit else None


def test_stop_string_across_pieces() -> None:
    assert _run_stops(["Hel", "lo wo", "rld"], ["o w"]) == ("Hell", "o w")
    assert _run_stops(["Hel", "lo wo", "rld"], ["o w"], include=True) == ("Hello w", "o w")
    assert _run_stops(["a", "b", "c", "d"], ["bcd", "c"]) == ("ab", "c")
    assert _run_stops(["abc"], ["zz"]) == ("abc", None)


def test_partial_stop_strings_are_held_back() -> None:
    f = StopStringFilter(["STOP"])
    assert f.push("abcST") == "abc"  # "ST" might still become "STOP"
    assert f.push("O") == ""
    assert f.push("x") == "STOx"  # not a stop after all: everything goes out
    assert f.push("S") == ""
    assert f.flush() == "S"


def test_every_split_of_a_stop_string_is_found() -> None:
    text = "the quick brown fox jumps"
    stop = "brown f"
    for cut in range(1, len(text)):
        for cut2 in range(cut + 1, len(text) + 1):
            pieces = [text[:cut], text[cut:cut2], text[cut2:]]
            assert _run_stops(pieces, [stop]) == ("the quick ", stop)
