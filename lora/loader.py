"""Read a PEFT LoRA adapter directory onto the CPU, checking everything before trusting it.

`adapter_config.json` + `adapter_model.safetensors` only; a directory that holds pickle weights
is refused outright. Every format check (config, header, names, shapes, values) is the one in
lora/adapter_format, which uploads run too; this module adds only the directory and the
tensors. The PEFT scale is folded into B, so serving computes x @ A.T @ B.T.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from lora.adapter_format import (
    CONFIG_FILE,
    WEIGHTS_FILE,
    FileSource,
    PeftLoraConfig,
    check_layout,
    iter_lora_arrays,
)
from lora.adapter_format.peft_config import MAX_CONFIG_BYTES
from lora.dims import BaseModelDims
from lora.errors import AdapterFormatError, PickleRejectedError

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
MAX_PATH_LEN = 4096


@dataclass(frozen=True)
class LoaderLimits:
    max_lora_rank: int
    max_header_bytes: int = 8 << 20
    max_weights_bytes: int = 4 << 30


@dataclass(frozen=True)
class LoraWeights:
    """One projection's LoRA pair on the CPU: float32 from the loader, in the model's dtype once
    the manager has read it (lora/manager.py)."""

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
        return self._map(torch.Tensor.pin_memory)

    def to(self, dtype: torch.dtype) -> LoadedAdapter:
        """The same adapter with its weights in `dtype` (self when they already are)."""
        if all(w.lora_a.dtype == dtype for w in self.modules.values()):
            return self
        return self._map(lambda t: t.to(dtype))

    def _map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> LoadedAdapter:
        modules = {k: LoraWeights(fn(w.lora_a), fn(w.lora_b)) for k, w in self.modules.items()}
        return LoadedAdapter(self.rank, modules, self.config)


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


def read_config_file(path: Path) -> bytes:
    if not path.is_file():
        raise AdapterFormatError(f"the adapter has no {CONFIG_FILE}", param="lora_path")
    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise AdapterFormatError(
            f"{CONFIG_FILE} is larger than {MAX_CONFIG_BYTES} bytes", param="lora_path"
        )
    return path.read_bytes()


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
    config_json = read_config_file(path / CONFIG_FILE)
    weights = path / WEIGHTS_FILE
    if not weights.is_file():
        raise AdapterFormatError(f"the adapter has no {WEIGHTS_FILE}", param="lora_path")
    with weights.open("rb") as f:
        source = FileSource(f, os.fstat(f.fileno()).st_size)
        if source.size > limits.max_weights_bytes:
            raise AdapterFormatError(
                f"{WEIGHTS_FILE} is larger than {limits.max_weights_bytes} bytes",
                param="lora_path",
            )
        layout = check_layout(
            config_json,
            source,
            dims,
            max_rank=limits.max_lora_rank,
            max_header_bytes=limits.max_header_bytes,
        )
        modules = {
            (w.layer, w.module): LoraWeights(torch.from_numpy(w.lora_a), torch.from_numpy(w.lora_b))
            for w in iter_lora_arrays(source, layout)
        }
    return LoadedAdapter(layout.rank, modules, layout.config)
