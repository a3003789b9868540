"""In-place edits of a float32 logits batch, one function per sampling parameter.

Each function states its semantics as the equivalent per-row PyTorch expression, takes plain
per-row Python values aligned with the logits rows, builds the small index or parameter tensors
it needs, and returns at once when no row asks for it (so an unused parameter costs nothing).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from itertools import chain

import torch

_NEG_INF = float("-inf")


def apply_logit_bias(logits: torch.Tensor, biases: Sequence[Mapping[int, float] | None]) -> None:
    """`logits[i, t] += biases[i][t]` for every token t in each row's map.

    logits: [num_rows, vocab] float32, edited in place.
    """
    rows: list[int] = []
    cols: list[int] = []
    values: list[float] = []
    for i, bias in enumerate(biases):
        if bias:
            rows.extend([i] * len(bias))
            cols.extend(bias.keys())
            values.extend(bias.values())
    if not rows:
        return
    device = logits.device
    index = (_long(rows, device), _long(cols, device))  # ([num_biased], [num_biased])
    bias_t = torch.tensor(values, dtype=torch.float32, device=device)  # [num_biased]
    logits.index_put_(index, bias_t, accumulate=True)


def apply_allowed_token_ids(logits: torch.Tensor, allowed: Sequence[Sequence[int] | None]) -> None:
    """`logits[i, t] = -inf` for every t not in `allowed[i]`; rows with None are untouched.

    logits: [num_rows, vocab] float32, edited in place.
    """
    rows = [i for i, ids in enumerate(allowed) if ids is not None]
    if not rows:
        return
    device = logits.device
    disallowed = torch.zeros_like(logits, dtype=torch.bool)  # [num_rows, vocab]
    disallowed[_long(rows, device)] = True
    ids_per_row = [allowed[i] or () for i in rows]
    flat_rows = list(chain(*([i] * len(ids) for i, ids in zip(rows, ids_per_row, strict=True))))
    disallowed[_long(flat_rows, device), _long(list(chain(*ids_per_row)), device)] = False
    logits.masked_fill_(disallowed, _NEG_INF)


def ban_token_ids(logits: torch.Tensor, banned: Sequence[Sequence[int]]) -> None:
    """`logits[i, banned[i]] = -inf`, except in a row where that leaves no finite logit.

    The exception keeps a row samplable when its constraints contradict each other (say
    `allowed_token_ids` holds only EOS while min_tokens bans EOS): an all -inf row would give
    NaN probabilities and an arbitrary token, whereas the allowed list is the stronger request.

    logits: [num_rows, vocab] float32, edited in place.
    """
    rows: list[int] = []
    cols: list[int] = []
    for i, ids in enumerate(banned):
        if ids:
            unique = set(ids)  # duplicates would be counted twice below
            rows.extend([i] * len(unique))
            cols.extend(unique)
    if not rows:
        return
    device = logits.device
    row_t, col_t = _long(rows, device), _long(cols, device)  # [num_banned] each
    current = logits[row_t, col_t]  # [num_banned]
    banned_rows = _long(sorted(set(rows)), device)  # [num_banned_rows]
    num_finite = torch.zeros(logits.shape[0], dtype=torch.long, device=device)  # [num_rows]
    num_finite[banned_rows] = (logits[banned_rows] > _NEG_INF).sum(dim=-1)
    num_finite_banned = torch.zeros_like(num_finite).index_add_(
        0, row_t, (current > _NEG_INF).long()
    )  # [num_rows]
    keeps_one = (num_finite > num_finite_banned)[row_t]  # [num_banned]
    logits[row_t, col_t] = torch.where(keeps_one, _NEG_INF, current)


def apply_penalties(
    logits: torch.Tensor,
    prompt_ids: Sequence[Sequence[int]],
    output_ids: Sequence[Sequence[int]],
    repetition: Sequence[float],
    frequency: Sequence[float],
    presence: Sequence[float],
) -> None:
    """Repetition, then frequency and presence penalties (vLLM and OpenAI definitions).

    Per row i, with `seen` the ids in prompt_ids[i] or output_ids[i] and `count[t]` the
    occurrences of t in output_ids[i]:
        x = logits[i]
        x[seen] = torch.where(x[seen] > 0, x[seen] / repetition[i], x[seen] * repetition[i])
        x -= frequency[i] * count + presence[i] * (count > 0)

    logits: [num_rows, vocab] float32, edited in place.
    """
    num_rows, vocab = logits.shape
    rows = [
        i
        for i in range(num_rows)
        if repetition[i] != 1.0 or frequency[i] != 0.0 or presence[i] != 0.0
    ]
    if not rows:
        return
    device = logits.device
    every_row = len(rows) == num_rows
    row_t = _long(rows, device)  # [num_pen]
    sub = logits if every_row else logits[row_t]  # [num_pen, vocab]
    out_counts = _count_ids([output_ids[i] for i in rows], vocab, device)  # [num_pen, vocab]

    if any(repetition[i] != 1.0 for i in rows):
        # Rows without a repetition penalty skip their (possibly long) prompt.
        prompts = [prompt_ids[i] if repetition[i] != 1.0 else () for i in rows]
        seen = (_count_ids(prompts, vocab, device) > 0) | (out_counts > 0)  # [num_pen, vocab]
        rep = _float([repetition[i] for i in rows], device).unsqueeze(1)  # [num_pen, 1]
        penalty = torch.where(seen, rep, 1.0)  # [num_pen, vocab]
        sub.copy_(torch.where(sub > 0, sub / penalty, sub * penalty))
    if any(frequency[i] != 0.0 for i in rows):
        freq = _float([frequency[i] for i in rows], device).unsqueeze(1)  # [num_pen, 1]
        sub.sub_(freq * out_counts)
    if any(presence[i] != 0.0 for i in rows):
        pres = _float([presence[i] for i in rows], device).unsqueeze(1)  # [num_pen, 1]
        sub.sub_(pres * (out_counts > 0))
    if not every_row:
        logits[row_t] = sub


def apply_min_p(logits: torch.Tensor, min_p: Sequence[float]) -> None:
    """`probs = logits.softmax(-1); logits[probs < min_p[:, None] * probs.amax(-1, keepdim=True)] = -inf`.

    Computed in log space (p_t / p_max = exp(x_t - x_max)), which needs no softmax; min_p 0
    gives a threshold of -inf and leaves the row untouched.

    logits: [num_rows, vocab] float32 after temperature, every row with a finite entry.
    """
    if not any(p > 0.0 for p in min_p):
        return
    log_min_p = _float([math.log(p) if p > 0.0 else _NEG_INF for p in min_p], logits.device)
    threshold = logits.amax(dim=-1, keepdim=True) + log_min_p.unsqueeze(1)  # [num_rows, 1]
    logits.masked_fill_(logits < threshold, _NEG_INF)


def apply_top_k_top_p(logits: torch.Tensor, top_k: Sequence[int], top_p: Sequence[float]) -> None:
    """Per row: keep the top_k largest logits (ties with the k-th are kept), then the smallest
    set of most likely survivors whose probability mass reaches top_p (at least one token);
    every other entry becomes -inf. top_k <= 0 or >= vocab, and top_p >= 1, disable.

    Matches vLLM's `apply_top_k_top_p`, except that a disabled row is never touched (vLLM's
    top_p=1 masks entries whose probability already underflowed to 0), so a row samples the
    same whatever the other rows ask for. That also lets only the top_p rows pay for the sort.

    logits: [num_rows, vocab] float32, edited in place.
    """
    vocab = logits.shape[1]
    is_k_row = [0 < k < vocab for k in top_k]
    p_rows = [i for i, p in enumerate(top_p) if p < 1.0]
    if not p_rows:
        if any(is_k_row):
            _apply_top_k_only(logits, top_k, is_k_row)
        return
    if len(p_rows) == len(top_p):
        _apply_top_k_top_p_sorted(logits, top_k, is_k_row, top_p)
        return
    others = [i for i in range(len(top_p)) if top_p[i] >= 1.0 and is_k_row[i]]
    if others:
        index = _long(others, logits.device)
        sub = logits[index]  # [num_others, vocab]
        _apply_top_k_only(sub, [top_k[i] for i in others], [True] * len(others))
        logits[index] = sub
    index = _long(p_rows, logits.device)
    sub = logits[index]  # [num_p_rows, vocab]
    p_top_k, p_is_k_row = [top_k[i] for i in p_rows], [is_k_row[i] for i in p_rows]
    _apply_top_k_top_p_sorted(sub, p_top_k, p_is_k_row, [top_p[i] for i in p_rows])
    logits[index] = sub


def _apply_top_k_top_p_sorted(
    logits: torch.Tensor, top_k: Sequence[int], is_k_row: Sequence[bool], top_p: Sequence[float]
) -> None:
    """Both filters on one ascending sort of each row; every row has top_p < 1."""
    device, vocab = logits.device, logits.shape[1]
    sorted_logits, order = logits.sort(dim=-1, stable=True)  # [num_rows, vocab] ascending
    if any(is_k_row):
        # Position of the k-th largest in ascending order; a disabled row points at its minimum.
        kth_pos = _long(
            [vocab - k if on else 0 for k, on in zip(top_k, is_k_row, strict=True)], device
        )
        kth = sorted_logits.gather(1, kth_pos.unsqueeze(1))  # [num_rows, 1]
        sorted_logits.masked_fill_(sorted_logits < kth, _NEG_INF)
    # A token drops while the mass of the tokens up to it stays <= 1 - top_p; the most likely
    # token always stays.
    drop_mass = _float([1.0 - p for p in top_p], device)  # [num_rows]
    cum = sorted_logits.softmax(dim=-1).cumsum_(dim=-1)  # [num_rows, vocab]
    drop = cum <= drop_mass.unsqueeze(1)  # [num_rows, vocab]
    drop[:, -1] = False
    sorted_logits.masked_fill_(drop, _NEG_INF)
    logits.scatter_(1, order, sorted_logits)


def _apply_top_k_only(logits: torch.Tensor, top_k: Sequence[int], is_k_row: Sequence[bool]) -> None:
    """Top-k without a full sort: topk(max k) gives each row's k-th largest value."""
    device = logits.device
    ks = [k if on else 1 for k, on in zip(top_k, is_k_row, strict=True)]
    top = logits.topk(max(ks), dim=-1).values  # [num_rows, max_k] descending
    kth = top.gather(1, _long([k - 1 for k in ks], device).unsqueeze(1))  # [num_rows, 1]
    kth.masked_fill_(~torch.tensor(is_k_row, device=device).unsqueeze(1), _NEG_INF)
    logits.masked_fill_(logits < kth, _NEG_INF)


def _count_ids(
    ids_per_row: Sequence[Sequence[int]], vocab: int, device: torch.device
) -> torch.Tensor:
    """`counts[r, t]` = occurrences of t in ids_per_row[r], as float32 [num_rows, vocab]."""
    counts = torch.zeros(len(ids_per_row), vocab, dtype=torch.float32, device=device)
    lengths = [len(ids) for ids in ids_per_row]
    num_ids = sum(lengths)
    if num_ids == 0:
        return counts
    flat_ids = _long(list(chain(*ids_per_row)), device)  # [num_ids]
    row_of = torch.repeat_interleave(
        torch.arange(len(ids_per_row), device=device), _long(lengths, device)
    )  # [num_ids]
    ones = torch.ones(num_ids, dtype=torch.float32, device=device)  # [num_ids]
    counts.view(-1).index_add_(0, row_of * vocab + flat_ids, ones)
    return counts


def _long(values: Sequence[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.long, device=device)


def _float(values: Sequence[float], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32, device=device)
