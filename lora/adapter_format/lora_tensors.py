"""Which tensors a PEFT LoRA adapter holds, and the shape each must have on a base model.

A tensor is `base_model.model.<module key>.lora_{A,B}[.default].weight` for one of the seven
Llama projections of a layer the base model has, of a module in `target_modules`. With the
module's rank r (`rank_pattern` may set it per module), A is [r, in_features] and B is
[out_features, r]. Every module has both or neither. Only the header is read here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from lora.adapter_format.peft_config import PeftLoraConfig
from lora.adapter_format.safetensors_header import WEIGHTS_FILE, TensorEntry
from lora.dims import BaseModelDims, module_key, parent_of
from lora.errors import AdapterBaseModelError, AdapterTensorError

_TENSOR = re.compile(
    r"^base_model\.model\.model\.layers\.(\d{1,6})\.(self_attn|mlp)\."
    r"(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)\.lora_(A|B)(?:\.default)?\.weight$"
)


def tensor_name(layer: int, module: str, which: str) -> str:
    """The name PEFT saves a module's lora_A or lora_B weight under (`which`: "A" or "B")."""
    return f"base_model.model.{module_key(layer, module)}.lora_{which}.weight"


def expected_shape(dims: BaseModelDims, module: str, which: str, rank: int) -> tuple[int, int]:
    d_in, d_out = dims.in_out(module)
    return (rank, d_in) if which == "A" else (d_out, rank)


@dataclass(frozen=True)
class TensorPair:
    """One projection's LoRA weights, as the header describes them (shapes already checked)."""

    layer: int
    module: str
    lora_a: TensorEntry  # [rank, in_features]
    lora_b: TensorEntry  # [out_features, rank]

    @property
    def rank(self) -> int:
        return self.lora_a.shape[0]


def pair_tensors(
    entries: dict[str, TensorEntry], config: PeftLoraConfig, dims: BaseModelDims
) -> list[TensorPair]:
    """Every tensor checked by name and shape, paired per module, sorted by (layer, module)."""
    found: dict[tuple[int, str], dict[str, TensorEntry]] = {}
    for name, entry in entries.items():
        label = repr(name[:100])
        match = _TENSOR.match(name)
        if match is None:
            raise AdapterTensorError(
                f"unexpected tensor {label}: only LoRA A/B weights are allowed"
            )
        layer, parent, module, which = int(match[1]), match[2], match[3], match[4]
        if parent != parent_of(module):
            raise AdapterTensorError(f"tensor {label} names the wrong parent module")
        if layer >= dims.num_layers:
            raise AdapterBaseModelError(
                f"tensor {label} targets layer {layer}; the base model has {dims.num_layers} layers"
            )
        if module not in config.target_modules:
            raise AdapterTensorError(f"tensor {label} targets a module not in target_modules")
        rank = config.module_rank(module_key(layer, module))
        expected = expected_shape(dims, module, which, rank)
        if entry.shape != expected:
            raise AdapterBaseModelError(
                f"tensor {label} has shape {list(entry.shape)}; the base model and rank "
                f"{rank} need {list(expected)}"
            )
        slot = found.setdefault((layer, module), {})
        if which in slot:
            raise AdapterTensorError(f"tensor {label} appears twice")
        slot[which] = entry
    if not found:
        raise AdapterTensorError(f"{WEIGHTS_FILE} holds no LoRA weights")
    pairs = []
    for (layer, module), pair in sorted(found.items()):
        if set(pair) != {"A", "B"}:
            raise AdapterTensorError(f"layer {layer} {module}: lora_A and lora_B are unpaired")
        pairs.append(TensorPair(layer, module, pair["A"], pair["B"]))
    return pairs
