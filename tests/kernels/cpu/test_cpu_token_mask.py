"""The token bitmask kernels (kernels/cpu/native/token_mask.cpp through kernels/cpu/token_mask.py)
against their PyTorch references: `mask_rows` bit for bit (allowed values, NaN included, are
left as they were; the other rows untouched), `masked_argmax` index for index in bfloat16 and
float32. Vocabularies of 33 (a last word of one column), 4100 (four) and 16384 (whole words);
row counts on both sides of the kernels' threading threshold (64 Ki elements); masks of every
shape a grammar gives: nothing, everything, random densities, one bit, the last word only."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
import torch

from kernels.cpu.native.build import NativeBuildError
from kernels.cpu.token_mask import (
    TokenMask,
    allowed_reference,
    mask_rows_reference,
    masked_argmax_reference,
    token_mask,
)

VOCABS = [33, 4100, 16384]
ROWS = [1, 9]  # 9 x 16384 crosses the kernels' threading threshold
DTYPES = [torch.bfloat16, torch.float32]
Mask = Callable[[torch.Generator, int, int], torch.Tensor]  # (gen, rows, cols) -> bitmask


@pytest.fixture(scope="module")
def kernel() -> TokenMask:
    try:
        return token_mask()
    except NativeBuildError as exc:
        reason = f"the token mask kernels did not build on this machine: {exc}"
        print(reason)
        pytest.skip(reason)


def _words(cols: int) -> int:
    return (cols + 31) // 32


def _from_allowed(allowed: torch.Tensor) -> torch.Tensor:
    """The int32 bitmask of a [rows, cols] bool tensor; bits past cols stay 0."""
    rows, cols = allowed.shape
    padded = torch.zeros(rows, _words(cols) * 32, dtype=torch.int64)
    padded[:, :cols] = allowed.long()
    weights = torch.tensor([1 << b for b in range(32)], dtype=torch.int64)
    words = (padded.view(rows, -1, 32) * weights).sum(-1)  # [rows, words] in [0, 2^32)
    return torch.where(words >= 1 << 31, words - (1 << 32), words).to(torch.int32)


def _density(p: float) -> Mask:
    return lambda gen, rows, cols: _from_allowed(torch.rand(rows, cols, generator=gen) < p)


def _single_bit(where: str) -> Mask:
    def make(gen: torch.Generator, rows: int, cols: int) -> torch.Tensor:
        allowed = torch.zeros(rows, cols, dtype=torch.bool)
        for r in range(rows):
            c = {"first": 0, "last": cols - 1, "random": None}[where]
            allowed[r, c if c is not None else int(torch.randint(cols, (1,), generator=gen))] = True
        return _from_allowed(allowed)

    return make


def _last_word(gen: torch.Generator, rows: int, cols: int) -> torch.Tensor:
    """Only columns of the last word, and every bit past `cols` set as well (ignored)."""
    bitmask = torch.zeros(rows, _words(cols), dtype=torch.int32)
    bitmask[:, -1] = -1
    return bitmask


def _words_mixed(gen: torch.Generator, rows: int, cols: int) -> torch.Tensor:
    """Whole words of zeros and of ones beside mixed words (structure beside free text)."""
    choice = torch.randint(3, (rows, _words(cols)), generator=gen)
    mixed = torch.randint(-(1 << 31), 1 << 31, (rows, _words(cols)), generator=gen)
    words = torch.where(choice == 0, 0, torch.where(choice == 1, -1, mixed)).to(torch.int32)
    return words & _from_allowed(torch.ones(rows, cols, dtype=torch.bool))  # none past cols


MASKS: dict[str, Mask] = {
    "none": lambda gen, rows, cols: torch.zeros(rows, _words(cols), dtype=torch.int32),
    "all": lambda gen, rows, cols: torch.full((rows, _words(cols)), -1, dtype=torch.int32),
    "half": _density(0.5),
    "sparse": _density(0.002),
    "dense": _density(0.995),
    "first_bit": _single_bit("first"),
    "last_bit": _single_bit("last"),
    "random_bit": _single_bit("random"),
    "last_word": _last_word,
    "words_mixed": _words_mixed,
}


def _logits(gen: torch.Generator, rows: int, cols: int, dtype: torch.dtype) -> torch.Tensor:
    """Logits with NaN, -inf and ties sprinkled in (bf16 rounding adds ties of its own)."""
    x = torch.randn(rows, cols, generator=gen) * 4
    specials = torch.rand(rows, cols, generator=gen)
    x[specials < 0.01] = float("-inf")
    x[(specials > 0.5) & (specials < 0.502)] = float("nan")
    x[specials > 0.997] = 12.0  # ties at a likely maximum
    return x.to(dtype)


def _strided(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(wide, view): the values inside a wider tensor, so rows have a stride past their width
    and guard columns either side that no kernel may write."""
    rows, cols = values.shape
    wide = torch.full((rows, cols + 7), 99.0, dtype=values.dtype)
    view = wide[:, 3 : 3 + cols]
    view.copy_(values)
    return wide, view


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous().view(torch.int32 if x.element_size() == 4 else torch.int16)


@pytest.mark.parametrize("cols", VOCABS)
@pytest.mark.parametrize("num_rows", ROWS)
@pytest.mark.parametrize("mask", list(MASKS))
def test_mask_rows_equals_the_reference_bit_for_bit(kernel, cols, num_rows, mask):
    gen = torch.Generator().manual_seed(cols * 31 + num_rows)
    x = _logits(gen, num_rows, cols, torch.float32)
    bitmask = MASKS[mask](gen, num_rows, cols)
    subsets = [list(range(num_rows)), [], [num_rows - 1], list(range(num_rows))[::-2]]
    for rows in subsets:
        (got_wide, got), (want_wide, want) = _strided(x), _strided(x)
        kernel.mask_rows(got, bitmask, rows)
        if rows:  # the reference cannot index no rows (MaskOps.apply never asks it to)
            mask_rows_reference(want, bitmask, rows)
        assert torch.equal(_bits(got_wide), _bits(want_wide)), (mask, rows)  # guards too
        untouched = [r for r in range(num_rows) if r not in rows]
        assert torch.equal(_bits(got[untouched]), _bits(x[untouched]))


def _settled(x: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """[rows] bool: rows where an allowed column holds more than -inf, or no bit is set at all.
    The two other kinds of row have tests of their own below."""
    allowed = allowed_reference(bitmask, x.shape[1])
    return (allowed & ~torch.isneginf(x.float())).any(-1) | (bitmask == 0).all(-1)


@pytest.mark.parametrize("cols", VOCABS)
@pytest.mark.parametrize("num_rows", ROWS)
@pytest.mark.parametrize("mask", list(MASKS))
def test_masked_argmax_equals_the_reference(kernel, cols, num_rows, mask):
    gen = torch.Generator().manual_seed(cols * 17 + num_rows)
    for dtype in DTYPES:
        finite = torch.randn(num_rows, cols, generator=gen).to(dtype)
        for values in (finite, _logits(gen, num_rows, cols, dtype)):  # then NaN, -inf, ties
            _, x = _strided(values)
            bitmask = MASKS[mask](gen, num_rows, cols)
            got = kernel.masked_argmax(x, bitmask)
            assert got.dtype == torch.int64 and got.shape == (num_rows,)
            settled = _settled(x, bitmask)
            want = masked_argmax_reference(x, bitmask)
            assert torch.equal(got[settled], want[settled]), (dtype, mask)
            allowed = allowed_reference(bitmask, cols)[settled]
            picked = allowed[torch.arange(len(allowed)), got[settled]]
            assert torch.equal(picked, allowed.any(-1))  # an allowed column wherever there is one


@pytest.mark.parametrize("dtype", DTYPES)
def test_ties_go_to_the_first_allowed_index_across_and_within_words(kernel, dtype):
    cols = 4100
    x = torch.zeros(3, cols, dtype=dtype)
    x[:, [40, 41, 2000, 4099]] = 5.0
    allowed = torch.ones(3, cols, dtype=torch.bool)
    allowed[1, 40] = False  # the first tie masked: the next one in the word wins
    allowed[2, :2000] = False  # a tie in a later word only
    bitmask = _from_allowed(allowed)
    assert kernel.masked_argmax(x, bitmask).tolist() == [40, 41, 2000]
    assert masked_argmax_reference(x, bitmask).tolist() == [40, 41, 2000]


@pytest.mark.parametrize("dtype", DTYPES)
def test_nan_wins_where_allowed_and_is_ignored_where_masked(kernel, dtype):
    x = torch.arange(64, dtype=torch.float32).repeat(2, 1)
    x[:, [10, 50]] = float("nan")
    allowed = torch.ones(2, 64, dtype=torch.bool)
    allowed[1, 10] = allowed[1, 50] = False
    bitmask = _from_allowed(allowed)
    assert kernel.masked_argmax(x.to(dtype), bitmask).tolist() == [10, 63]
    assert masked_argmax_reference(x.to(dtype), bitmask).tolist() == [10, 63]


def test_a_row_whose_allowed_values_are_all_minus_inf(kernel):
    x = torch.full((1, 64), float("-inf"))
    bitmask = _from_allowed(torch.arange(64).unsqueeze(0) == 37)
    assert torch.equal(kernel.masked_argmax(x, bitmask), masked_argmax_reference(x, bitmask))


def test_bits_past_the_vocabulary_allow_nothing(kernel):
    x = torch.randn(1, 33)
    bitmask = torch.tensor([[0, -2]], dtype=torch.int32)  # word 1: every bit but column 32
    assert kernel.masked_argmax(x, bitmask).tolist() == [0]


# ---- argument checks -------------------------------------------------------------------------


def test_bad_arguments_raise_value_error_naming_them(kernel):
    x = torch.randn(4, 40)
    bitmask = torch.full((4, 2), -1, dtype=torch.int32)
    bad_calls = [
        (lambda: kernel.mask_rows(x[0], bitmask, [0]), "x must be"),
        (lambda: kernel.masked_argmax(x.t().contiguous().t(), bitmask), "x must be"),
        (lambda: kernel.masked_argmax(x.to("meta"), bitmask), "x must be"),
        (lambda: kernel.mask_rows(x, bitmask.long(), [0]), "bitmask must be"),
        (
            lambda: kernel.mask_rows(x, torch.full((2, 4), -1, dtype=torch.int32).t(), [0]),
            "bitmask",
        ),
        (lambda: kernel.masked_argmax(x, bitmask[:3]), "bitmask must be [4, 2]"),
        (lambda: kernel.masked_argmax(x, torch.zeros(4, 1, dtype=torch.int32)), "bitmask must"),
        (lambda: kernel.mask_rows(x, bitmask, [4]), "rows must"),
        (lambda: kernel.mask_rows(x, bitmask, [-1]), "rows must"),
        (lambda: kernel.mask_rows(x.bfloat16(), bitmask, [0]), "float32"),
        (lambda: kernel.masked_argmax(x.half(), bitmask), "bfloat16 or float32"),
    ]
    before = x.clone()
    for call, says in bad_calls:
        with pytest.raises(ValueError, match=re.escape(says)):
            call()
    assert torch.equal(x, before)  # refused before anything was written
