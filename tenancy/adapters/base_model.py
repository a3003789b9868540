"""The served base model as upload validation sees it: `BaseModelSpec` (a settings field) read
from the served checkpoint's config.json, and the LoRA shapes it implies.

The shapes come from lora/adapter_format, the module the engine's loader checks adapters with,
so an upload accepted here is one the engine serving that checkpoint accepts.
"""

from __future__ import annotations

from pathlib import Path

from lora.adapter_format import (
    LORA_MODULES,
    BaseModelDims,
    expected_shape,
    read_checkpoint_shape,
    tensor_name,
)
from tenancy.settings import BaseModelSpec


def base_model_spec(model_dir: Path, name: str) -> BaseModelSpec:
    """The checkpoint's shapes under the name clients use for it. ValueError when its
    config.json is missing or lacks a shape field (then set `base_model` explicitly)."""
    shape = read_checkpoint_shape(model_dir)
    return BaseModelSpec(
        name=name,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_layers,
        num_attention_heads=shape.num_heads,
        num_key_value_heads=shape.num_kv_heads,
        head_dim=shape.head_dim,
    )


def base_model_dims(base: BaseModelSpec) -> BaseModelDims:
    head_dim = base.resolved_head_dim
    return BaseModelDims(
        num_layers=base.num_hidden_layers,
        hidden_size=base.hidden_size,
        q_size=base.num_attention_heads * head_dim,
        kv_size=base.num_key_value_heads * head_dim,
        intermediate_size=base.intermediate_size,
        names=(base.name,),
    )


def lora_tensor_shapes(base: BaseModelSpec, *, rank: int) -> dict[str, tuple[int, int]]:
    """Every tensor of a rank-`rank` adapter on all seven projections of every layer: PEFT's
    name -> the shape upload validation and the loader require, layer by layer, A before B."""
    dims = base_model_dims(base)
    return {
        tensor_name(layer, module, which): expected_shape(dims, module, which, rank)
        for layer in range(dims.num_layers)
        for module in LORA_MODULES
        for which in ("A", "B")
    }
