"""A step's grammar rows as a token bitmask, and that bitmask applied to logits rows.

Layout (llguidance's, also xgrammar's): int32 [num_rows, ceil(vocab / 32)]; bit b of word w of
row r allows token 32 * w + b. A padded vocabulary's ids past the tokenizer are never allowed;
a matcher that is stopped or in error allows only EOS (llguidance's rule), so such a row still
has a token to sample. Rows without a grammar are all ones.

`MaskOps` applies it: by the native kernels (kernels/cpu/token_mask.py) on CPU logits where
they are built, else by their PyTorch references, which compute the same.
"""

from __future__ import annotations

from collections.abc import Sequence

import llguidance
import llguidance.torch
import torch

from engine.structured.matcher import GrammarMatcher
from kernels.cpu.token_mask import (
    TokenMask,
    mask_rows_reference,
    masked_argmax_reference,
)

# From this many rows on, the masks are computed on llguidance's thread pool; below it the
# pool's hand-off costs more than it saves.
PARALLEL_FILL_MIN_ROWS = 8


def fill_bitmask(
    matchers: Sequence[tuple[int, GrammarMatcher]],
    num_rows: int,
    vocab_size: int,
    executor: llguidance.LLExecutor | None = None,
) -> torch.Tensor:  # [num_rows, ceil(vocab / 32)] int32
    """The next-token masks of the (row, matcher) pairs; every other row allows everything."""
    bitmask = torch.full((num_rows, (vocab_size + 31) // 32), -1, dtype=torch.int32)
    if executor is not None and len(matchers) >= PARALLEL_FILL_MIN_ROWS:
        llguidance.torch.fill_next_token_bitmask_par(
            executor, [(m.matcher, row) for row, m in matchers], bitmask
        )
    else:
        for row, m in matchers:
            llguidance.torch.fill_next_token_bitmask(m.matcher, bitmask, row)
    return bitmask


class MaskOps:
    """The bitmask's two uses in the sampler, native where `native` is given."""

    def __init__(self, native: TokenMask | None) -> None:
        self._native = native

    def _takes(self, logits: torch.Tensor) -> bool:
        return self._native is not None and logits.device.type == "cpu" and logits.stride(1) == 1

    def apply(self, logits: torch.Tensor, bitmask: torch.Tensor, rows: Sequence[int]) -> None:
        """`logits[r, t] = -inf` for every token t the bitmask does not allow, in each listed
        row r. logits: [num_rows, vocab] float32, edited in place."""
        if not rows:
            return
        if self._native is not None and self._takes(logits):
            self._native.mask_rows(logits, bitmask, rows)
        else:
            mask_rows_reference(logits, bitmask.to(logits.device), rows)

    def argmax(self, logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
        """Each row's argmax over the tokens it allows ([num_rows] int64), from logits of the
        model's dtype: no float32 copy, as a greedy step without a grammar."""
        if (
            self._native is not None
            and self._takes(logits)
            and logits.dtype in (torch.bfloat16, torch.float32)
        ):
            return self._native.masked_argmax(logits, bitmask)
        return masked_argmax_reference(logits, bitmask.to(logits.device))
