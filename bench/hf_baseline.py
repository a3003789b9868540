"""The transformers baseline: static batches through `generate`, left-padded, greedy.

Each batch runs to its longest request (max_new_tokens = the batch's largest output length)
and only each request's own tokens count as useful, which is what a server batching
`generate` calls would deliver.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from measurement import SystemResult
from workload import BenchRequest


@dataclass(frozen=True)
class HFSettings:
    batch_size: int
    # Run only the first `num_requests` requests (None: all); stated in the table and JSON.
    num_requests: int | None = None


def load_hf_model(model_dir: Path, dtype: torch.dtype) -> Any:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype).eval()
    # No EOS: every row generates exactly max_new_tokens, as the engine does with ignore_eos.
    model.generation_config.eos_token_id = None
    return model


def _left_pad(batch: Sequence[BenchRequest], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(r.num_prompt_tokens for r in batch)
    input_ids = torch.full((len(batch), width), pad_id, dtype=torch.long)  # [B, width]
    attention_mask = torch.zeros(len(batch), width, dtype=torch.long)  # [B, width], 1 = real
    for row, request in enumerate(batch):
        n = request.num_prompt_tokens
        input_ids[row, width - n :] = torch.tensor(request.prompt_token_ids, dtype=torch.long)
        attention_mask[row, width - n :] = 1
    return input_ids, attention_mask


@torch.inference_mode()
def _generate(model: Any, batch: Sequence[BenchRequest], pad_id: int) -> int:
    """Runs one batch; returns the number of new tokens generated per row."""
    input_ids, attention_mask = _left_pad(batch, pad_id)
    out = model.generate(
        input_ids=input_ids,
        attention_mask=attention_mask,
        max_new_tokens=max(r.num_output_tokens for r in batch),
        do_sample=False,
        pad_token_id=pad_id,
    )  # [B, width + generated]
    return int(out.shape[1] - input_ids.shape[1])


def warm_up(model: Any, requests: Sequence[BenchRequest], pad_id: int) -> None:
    """A short batch so one-time kernel selection and allocator growth are not timed."""
    _generate(model, requests, pad_id)


def run_hf(
    model: Any, requests: Sequence[BenchRequest], settings: HFSettings, pad_id: int
) -> SystemResult:
    subset = list(requests[: settings.num_requests])
    num_useful = 0
    num_generated = 0
    start = time.perf_counter()
    for first in range(0, len(subset), settings.batch_size):
        batch = subset[first : first + settings.batch_size]
        generated = _generate(model, batch, pad_id)
        num_generated += generated * len(batch)
        num_useful += sum(min(r.num_output_tokens, generated) for r in batch)
    elapsed = time.perf_counter() - start
    return SystemResult(
        system="transformers",
        batch_size=settings.batch_size,
        num_requests=len(subset),
        num_requests_total=len(requests),
        num_useful_tokens=num_useful,
        num_generated_tokens=num_generated,
        elapsed_s=elapsed,
    )
