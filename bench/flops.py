"""The machine's matmul peak and the model FLOPs a run performs.

Model FLOPs count only useful work (no padding, no recompute after preemption):
- linear: 2 x (decoder-layer weights) per token fed through the model,
- lm_head: 2 x (hidden x vocab) per sampled position (both systems only project the rows
  they sample from),
- attention: QK^T and PV, 2 x head_dim FLOPs each per (query, key) pair per head per layer,
  over causal pairs only.
Norms, RoPE, SiLU and the embedding lookup are left out (well under 1% here).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from engine.models.hf_config import ModelConfig


@dataclass(frozen=True)
class MatmulPeak:
    flops_per_s: float  # best over sizes and repeats
    size: int  # the n of the n x n x n matmul that reached it
    by_size: dict[int, float]


def measure_matmul_peak(
    dtype: torch.dtype, sizes: Sequence[int], *, warmup: int = 2, repeats: int = 5
) -> MatmulPeak:
    """Best FLOP/s of `a @ b` for square n x n operands, over `sizes` and `repeats`."""
    by_size: dict[int, float] = {}
    generator = torch.Generator().manual_seed(0)
    for n in sizes:
        a = torch.randn(n, n, generator=generator).to(dtype)  # [n, n]
        b = torch.randn(n, n, generator=generator).to(dtype)  # [n, n]
        out = torch.empty(n, n, dtype=dtype)  # [n, n], reused so allocation is not timed
        for _ in range(warmup):
            torch.matmul(a, b, out=out)
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            torch.matmul(a, b, out=out)
            best = min(best, time.perf_counter() - start)
        by_size[n] = 2 * n**3 / best
    size = max(by_size, key=lambda n: by_size[n])
    return MatmulPeak(by_size[size], size, by_size)


@dataclass(frozen=True)
class FlopModel:
    linear_params: int  # decoder layers' weight elements (q/k/v/o, gate/up/down)
    lm_head_params: int
    attention_flops_per_pair: int  # one query attending to one key, all heads and layers

    @classmethod
    def from_config(cls, c: ModelConfig) -> FlopModel:
        per_layer = (
            c.hidden_size * (c.q_size + 2 * c.kv_size)
            + c.q_size * c.hidden_size
            + 3 * c.hidden_size * c.intermediate_size
        )
        return cls(
            linear_params=c.num_layers * per_layer,
            lm_head_params=c.hidden_size * c.vocab_size,
            attention_flops_per_pair=4 * c.num_heads * c.head_dim * c.num_layers,
        )

    @property
    def non_embedding_params(self) -> int:
        """Every matmul weight (the lm_head included); the input embedding is a lookup."""
        return self.linear_params + self.lm_head_params


@dataclass
class FlopCount:
    num_tokens: int = 0  # positions fed through the decoder layers
    num_sampled: int = 0  # positions projected through the lm_head
    num_attention_pairs: int = 0

    def add_request(self, num_prompt: int, num_output: int) -> None:
        """A request run to completion: every prompt and output token except the last output
        is fed once, and the token at position p attends to p + 1 keys."""
        num_fed = num_prompt + num_output - 1
        self.num_tokens += num_fed
        self.num_sampled += num_output
        self.num_attention_pairs += num_fed * (num_fed + 1) // 2

    def add_decode(self, context_lens: Iterable[int]) -> None:
        """One decode step: one new token per sequence, attending to its whole context."""
        for context_len in context_lens:
            self.num_tokens += 1
            self.num_sampled += 1
            self.num_attention_pairs += context_len

    def flops(self, model: FlopModel, *, with_attention: bool = True) -> float:
        total = 2 * model.linear_params * self.num_tokens + 2 * model.lm_head_params * (
            self.num_sampled
        )
        if with_attention:
            total += model.attention_flops_per_pair * self.num_attention_pairs
        return float(total)
