"""A PEFT LoRA adapter checked end to end: config, header, tensor names and shapes, values.

The one sequence both readers run: `check_layout` (the config and the safetensors header, no
tensor read), then `iter_lora_arrays` (each pair read, scaled and range-checked in turn). The
loader keeps the arrays; an upload only needs `check_adapter` to have read them all once.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from lora.adapter_format.lora_tensors import TensorPair, pair_tensors
from lora.adapter_format.peft_config import PeftLoraConfig, parse_config_json, parse_peft_config
from lora.adapter_format.safetensors_header import WeightsSource, read_header
from lora.adapter_format.weights import LoraArrays, read_pair
from lora.dims import BaseModelDims, module_key


@dataclass(frozen=True)
class AdapterLayout:
    config: PeftLoraConfig
    pairs: list[TensorPair]  # sorted by (layer, module)

    @property
    def rank(self) -> int:
        """The largest module rank (rank_pattern may give modules different ranks)."""
        return max(pair.rank for pair in self.pairs)


def check_layout(
    config_json: bytes,
    source: WeightsSource,
    dims: BaseModelDims,
    *,
    max_rank: int,
    max_header_bytes: int,
) -> AdapterLayout:
    """Everything but the tensor values; raises an AdapterError subclass naming the problem."""
    config = parse_peft_config(parse_config_json(config_json), dims, max_rank=max_rank)
    entries = read_header(source, max_header_bytes=max_header_bytes)
    return AdapterLayout(config, pair_tensors(entries, config, dims))


def iter_lora_arrays(source: WeightsSource, layout: AdapterLayout) -> Iterator[LoraArrays]:
    for pair in layout.pairs:
        scale = layout.config.module_scale(module_key(pair.layer, pair.module))
        yield read_pair(source, pair, scale)


def check_adapter(
    config_json: bytes,
    source: WeightsSource,
    dims: BaseModelDims,
    *,
    max_rank: int,
    max_header_bytes: int,
) -> AdapterLayout:
    """Every check the loader runs, values included, holding one pair in memory at a time."""
    layout = check_layout(
        config_json, source, dims, max_rank=max_rank, max_header_bytes=max_header_bytes
    )
    for _ in iter_lora_arrays(source, layout):
        pass
    return layout
