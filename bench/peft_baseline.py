"""The PEFT baselines of the LoRA benchmark: PEFT's mixed-adapter batched `generate`
(`adapter_names=`, left-padded static batches, each run to its longest request; only each
request's own tokens count) and PEFT one request at a time (`set_adapter`)."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import hf_baseline
import torch
from workload import BenchRequest


def timed(fn: Callable[[], int]) -> tuple[int, float, float]:
    """(fn's result, wall seconds, this process's CPU seconds)."""
    # Engines and models of earlier cells sit in reference cycles: collect them now, not
    # inside this cell's clocks.
    gc.collect()
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn()
    return result, time.perf_counter() - wall, time.process_time() - cpu


def load_peft(model_dir: Path, dtype: torch.dtype, adapters: dict[str, Path]) -> Any:
    from peft import PeftModel

    names = list(adapters)
    base = hf_baseline.load_hf_model(model_dir, dtype)
    # autocast_adapter_dtype=False keeps the adapters in the benchmark dtype (PEFT would
    # otherwise upcast them to float32, which is slower): the fastest PEFT we can configure.
    model = PeftModel.from_pretrained(
        base, str(adapters[names[0]]), adapter_name=names[0], autocast_adapter_dtype=False
    )
    for name in names[1:]:
        model.load_adapter(str(adapters[name]), adapter_name=name, autocast_adapter_dtype=False)
    return model.eval()


@torch.inference_mode()
def _mixed(
    model: Any, requests: Sequence[BenchRequest], adapters: Sequence[str], batch_size: int
) -> int:
    useful = 0
    for first in range(0, len(requests), batch_size):
        batch = list(requests[first : first + batch_size])
        input_ids, attention_mask = hf_baseline._left_pad(batch, pad_id=0)
        out = model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            max_new_tokens=max(r.num_output_tokens for r in batch),
            do_sample=False,
            pad_token_id=0,
            adapter_names=list(adapters[first : first + len(batch)]),
        )  # [B, width + generated]
        generated = int(out.shape[1] - input_ids.shape[1])
        useful += sum(min(r.num_output_tokens, generated) for r in batch)
    return useful


@torch.inference_mode()
def _sequential(model: Any, requests: Sequence[BenchRequest], adapters: Sequence[str]) -> int:
    useful = 0
    for r, name in zip(requests, adapters, strict=True):
        model.set_adapter(name)
        ids = torch.tensor([r.prompt_token_ids])  # [1, prompt]
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=r.num_output_tokens,
            do_sample=False,
            pad_token_id=0,
        )
        useful += int(out.shape[1] - ids.shape[1])
    return useful


def run_peft(
    model: Any,
    mixed: tuple[int, int],
    num_sequential: int,
    requests: Sequence[BenchRequest],
    adapters: Sequence[str],
) -> list[tuple[str, str, int, int, float, float]]:
    """(name, setting, requests run, useful tokens, wall s, cpu s) for the mixed batch
    (batch size, first n requests), then for one request at a time (first n)."""
    short = [BenchRequest(0, requests[0].prompt_token_ids[:16], 4)] * 2
    _mixed(model, short, adapters[:2], 2)  # warm-up
    batch, n = mixed
    tokens, wall, cpu = timed(lambda: _mixed(model, requests[:n], adapters[:n], batch))
    cells = [("peft-mixed", f"adapter_names=, batch {batch}", n, tokens, wall, cpu)]
    n = num_sequential
    tokens, wall, cpu = timed(lambda: _sequential(model, requests[:n], adapters[:n]))
    cells.append(("peft-sequential", "set_adapter, batch 1", n, tokens, wall, cpu))
    return cells
