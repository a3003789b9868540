"""Read a PEFT LoRA adapter directory onto the CPU, checking everything before trusting it.

`adapter_config.json` + `adapter_model.safetensors` only; a directory that holds pickle weights
is refused outright. Each tensor is checked against the base model (layer, module, shape) and
the per-module rank; the PEFT scale is folded into B, so serving computes x @ A.T @ B.T.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import torch

from lora.dims import BaseModelDims, module_key, parent_of
from lora.errors import (
    AdapterBaseModelError,
    AdapterFormatError,
    AdapterTensorError,
    PickleRejectedError,
)
from lora.peft_config import PeftLoraConfig, parse_peft_config, read_config_file
from lora.safetensors_check import TensorEntry, read_header, read_tensor

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
MAX_PATH_LEN = 4096

_TENSOR = re.compile(
    r"^base_model\.model\.model\.layers\.(\d{1,6})\.(self_attn|mlp)\."
    r"(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)\.lora_(A|B)(?:\.default)?\.weight$"
)


@dataclass(frozen=True)
class LoaderLimits:
    max_lora_rank: int
    max_header_bytes: int = 8 << 20
    max_weights_bytes: int = 4 << 30


@dataclass(frozen=True)
class LoraWeights:
    """One projection's LoRA pair, float32 on the CPU."""

    lora_a: torch.Tensor  # [rank, in_features]
    lora_b: torch.Tensor  # [out_features, rank], the PEFT scale already folded in

    @property
    def rank(self) -> int:
        return int(self.lora_a.shape[0])


@dataclass(frozen=True)
class LoadedAdapter:
    rank: int  # the largest module rank (rank_pattern may give modules different ranks)
    modules: dict[tuple[int, str], LoraWeights]  # (layer, module short name) -> weights
    config: PeftLoraConfig

    @property
    def num_bytes(self) -> int:
        return sum(
            w.lora_a.numel() * w.lora_a.element_size() + w.lora_b.numel() * w.lora_b.element_size()
            for w in self.modules.values()
        )

    def pin_memory(self) -> LoadedAdapter:
        """A copy in page-locked memory, so copies to the accelerator can run asynchronously."""
        pinned = {
            key: LoraWeights(w.lora_a.pin_memory(), w.lora_b.pin_memory())
            for key, w in self.modules.items()
        }
        return LoadedAdapter(self.rank, pinned, self.config)


def check_path(lora_path: object) -> Path:
    if not isinstance(lora_path, str) or not 0 < len(lora_path) <= MAX_PATH_LEN:
        raise AdapterFormatError(
            f"lora_path must be a non-empty string of at most {MAX_PATH_LEN} characters",
            param="lora_path",
        )
    if "\x00" in lora_path:
        raise AdapterFormatError("lora_path must not contain NUL", param="lora_path")
    path = Path(lora_path)
    if not path.is_dir():
        raise AdapterFormatError("lora_path is not a readable adapter directory", param="lora_path")
    return path


def load_adapter(lora_path: str, dims: BaseModelDims, limits: LoaderLimits) -> LoadedAdapter:
    """Validate and read an adapter; raises an AdapterError subclass naming the problem."""
    path = check_path(lora_path)
    try:
        pickles = sorted(p.name for p in path.iterdir() if p.suffix.lower() in PICKLE_SUFFIXES)
    except OSError as exc:
        raise AdapterFormatError("lora_path cannot be listed", param="lora_path") from exc
    if pickles:
        raise PickleRejectedError(
            f"the adapter holds pickle files ({', '.join(n[:60] for n in pickles[:4])}); "
            "only adapter_model.safetensors is read",
            param="lora_path",
        )
    config = parse_peft_config(
        read_config_file(path / CONFIG_FILE), dims, max_rank=limits.max_lora_rank
    )
    weights = path / WEIGHTS_FILE
    if not weights.is_file():
        raise AdapterFormatError(f"the adapter has no {WEIGHTS_FILE}", param="lora_path")
    if weights.stat().st_size > limits.max_weights_bytes:
        raise AdapterFormatError(
            f"{WEIGHTS_FILE} is larger than {limits.max_weights_bytes} bytes", param="lora_path"
        )
    entries = read_header(weights, max_header_bytes=limits.max_header_bytes)
    pairs = _pair_entries(entries, config, dims)
    modules: dict[tuple[int, str], LoraWeights] = {}
    for (layer, module), (entry_a, entry_b) in sorted(pairs.items()):
        lora_a = read_tensor(weights, entry_a).to(torch.float32)  # [r, in]
        lora_b = read_tensor(weights, entry_b).to(torch.float32)  # [out, r]
        scale = config.module_scale(module_key(layer, module))
        lora_b = lora_b * scale
        if not (_in_range(lora_a) and _in_range(lora_b)):
            raise AdapterTensorError(
                f"layer {layer} {module}: LoRA weights (B times the scale) must be finite and "
                f"within +-{MAX_WEIGHT_MAGNITUDE:g}"
            )
        modules[(layer, module)] = LoraWeights(lora_a.contiguous(), lora_b.contiguous())
    return LoadedAdapter(max(w.rank for w in modules.values()), modules, config)


# The float16 range: no model dtype turns an accepted weight into inf, which would make the
# adapter answer NaN logits. Real LoRA weights are many orders of magnitude smaller; a clear
# error at load beats garbage tokens later.
MAX_WEIGHT_MAGNITUDE = 65504.0


def _in_range(tensor: torch.Tensor) -> bool:
    return bool(torch.isfinite(tensor).all()) and float(tensor.abs().max()) <= MAX_WEIGHT_MAGNITUDE


def _pair_entries(
    entries: dict[str, TensorEntry], config: PeftLoraConfig, dims: BaseModelDims
) -> dict[tuple[int, str], tuple[TensorEntry, TensorEntry]]:
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
        d_in, d_out = dims.in_out(module)
        expected = (rank, d_in) if which == "A" else (d_out, rank)
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
    for (layer, module), pair in found.items():
        if set(pair) != {"A", "B"}:
            raise AdapterTensorError(f"layer {layer} {module}: lora_A and lora_B are unpaired")
    return {key: (pair["A"], pair["B"]) for key, pair in found.items()}
