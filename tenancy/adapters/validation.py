"""The adapter validation seam. The LoRA loader (lora/loader.py) will provide a stronger
validator; until then FormatChecksValidator runs the format checks. Both implement
AdapterValidator, which the runtime takes as a parameter.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from tenancy.adapters.archive import CONFIG, WEIGHTS
from tenancy.adapters.errors import AdapterRejected
from tenancy.adapters.peft_config import ATTENTION, LoraSpec, parse_adapter_config
from tenancy.adapters.safetensors_header import TensorInfo, parse_header
from tenancy.settings import BaseModelSpec, TenancySettings

_TENSOR = re.compile(
    r"^base_model\.model\.model\.layers\.(\d{1,6})\.(self_attn|mlp)\."
    r"(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)\.lora_(A|B)\.weight$"
)
_FLOAT_DTYPES = frozenset({"F32", "F16", "BF16"})


@dataclass(frozen=True)
class ValidatedAdapter:
    spec: LoraSpec
    files: Mapping[str, bytes]
    sha256: str  # over the weights file
    size_bytes: int


class AdapterValidator(Protocol):
    def validate(self, files: Mapping[str, bytes]) -> ValidatedAdapter:
        """Raise AdapterRejected (400 naming the problem) or return the adapter's facts."""
        ...


def module_dims(base: BaseModelSpec, module: str) -> tuple[int, int]:
    """(in_features, out_features) of a base-model projection."""
    h, i, hd = base.hidden_size, base.intermediate_size, base.resolved_head_dim
    q, kv = base.num_attention_heads * hd, base.num_key_value_heads * hd
    return {
        "q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
        "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h),
    }[module]  # fmt: skip


def check_shapes(tensors: list[TensorInfo], spec: LoraSpec, base: BaseModelSpec) -> None:
    if not tensors:
        raise AdapterRejected("adapter_model.safetensors holds no tensors.")
    seen: dict[tuple[int, str], set[str]] = {}
    for t in tensors:
        m = _TENSOR.match(t.name)
        label = repr(t.name[:100])
        if m is None:
            raise AdapterRejected(f"Unexpected tensor {label}: only LoRA A/B weights are allowed.")
        layer, parent, module, ab = int(m[1]), m[2], m[3], m[4]
        if (parent == "self_attn") != (module in ATTENTION):
            raise AdapterRejected(f"Tensor {label} names the wrong parent module.")
        if layer >= base.num_hidden_layers:
            raise AdapterRejected(f"Tensor {label} targets a layer the base model lacks.")
        if module not in spec.target_modules:
            raise AdapterRejected(f"Tensor {label} targets a module not in target_modules.")
        if t.dtype not in _FLOAT_DTYPES:
            raise AdapterRejected(f"Tensor {label} must be F32, F16 or BF16.")
        d_in, d_out = module_dims(base, module)
        expected = (spec.rank, d_in) if ab == "A" else (d_out, spec.rank)
        if t.shape != expected:
            raise AdapterRejected(
                f"Tensor {label} has shape {list(t.shape)}; the base model and rank need"
                f" {list(expected)}."
            )
        seen.setdefault((layer, module), set()).add(ab)
    unpaired = [k for k, v in seen.items() if v != {"A", "B"}]
    if unpaired:
        raise AdapterRejected(f"LoRA A/B weights are unpaired for layer {unpaired[0][0]}.")


class FormatChecksValidator:
    def __init__(self, settings: TenancySettings) -> None:
        self._base = settings.base_model
        self._limits = settings.adapter_limits

    def validate(self, files: Mapping[str, bytes]) -> ValidatedAdapter:
        spec = parse_adapter_config(files[CONFIG], base=self._base, max_rank=self._limits.max_rank)
        weights = files[WEIGHTS]
        tensors = parse_header(weights, max_header_bytes=self._limits.max_safetensors_header_bytes)
        check_shapes(tensors, spec, self._base)
        return ValidatedAdapter(
            spec=spec,
            files=files,
            sha256=hashlib.sha256(weights).hexdigest(),
            size_bytes=sum(len(v) for v in files.values()),
        )
