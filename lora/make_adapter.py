"""`loragate make-adapter`: a PEFT-format LoRA adapter (adapter_config.json +
adapter_model.safetensors) with seeded random weights, for a checkpoint's shapes. For tests,
benchmarks and trying an upload; the weights mean nothing.

Written without torch (numpy + safetensors), with the tensor names and shapes of
lora/adapter_format, the module the engine's loader and upload validation check adapters with,
so every adapter made here loads in PEFT, in the engine and through an upload (rank within the
server's limit). A is drawn as PEFT initializes it (uniform in +-1/sqrt(in_features)); B, which
PEFT starts at zero, is drawn from N(0, b_std) so the adapter changes the model's output.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from safetensors.numpy import save

from lora.adapter_format import (
    CONFIG_FILE,
    LORA_MODULES,
    WEIGHTS_FILE,
    expected_shape,
    read_checkpoint_shape,
    tensor_name,
)

DEFAULT_B_STD = 0.01


@dataclass(frozen=True)
class AdapterRecipe:
    rank: int
    seed: int = 0
    alpha: float | None = None  # None: 2 x rank, as PEFT's examples and our demo use
    target_modules: tuple[str, ...] = LORA_MODULES
    b_std: float = DEFAULT_B_STD
    base_model_name: str | None = None  # None: the checkpoint directory's name

    def __post_init__(self) -> None:
        if self.rank < 1:
            raise ValueError(f"rank must be a positive integer, got {self.rank}")
        if self.alpha is not None and not self.alpha > 0:
            raise ValueError(f"alpha must be positive, got {self.alpha}")
        unknown = sorted(set(self.target_modules) - set(LORA_MODULES))
        if unknown or not self.target_modules:
            raise ValueError(
                f"target_modules must be some of {list(LORA_MODULES)}, got {list(self.target_modules)}"
            )


@dataclass(frozen=True)
class AdapterFiles:
    config: dict[str, object]
    tensors: dict[str, np.ndarray] = field(repr=False)  # PEFT name -> float32 array

    def as_bytes(self) -> dict[str, bytes]:
        """File name -> contents, as an upload carries them."""
        return {
            CONFIG_FILE: json.dumps(self.config, indent=2).encode(),
            WEIGHTS_FILE: save(self.tensors),
        }


def adapter_files(model_dir: Path, recipe: AdapterRecipe) -> AdapterFiles:
    """The adapter for the checkpoint in `model_dir` (its config.json gives the shapes)."""
    dims = read_checkpoint_shape(model_dir).dims()
    rng = np.random.default_rng(recipe.seed)
    modules = [m for m in LORA_MODULES if m in recipe.target_modules]  # a stable order
    tensors: dict[str, np.ndarray] = {}
    for layer in range(dims.num_layers):
        for module in modules:
            a_shape = expected_shape(dims, module, "A", recipe.rank)  # [rank, in]
            b_shape = expected_shape(dims, module, "B", recipe.rank)  # [out, rank]
            bound = 1.0 / np.sqrt(a_shape[1])
            a = rng.uniform(-bound, bound, size=a_shape)
            b = rng.normal(0.0, recipe.b_std, size=b_shape)
            tensors[tensor_name(layer, module, "A")] = a.astype(np.float32)
            tensors[tensor_name(layer, module, "B")] = b.astype(np.float32)
    config: dict[str, object] = {
        "peft_type": "LORA",
        "base_model_name_or_path": recipe.base_model_name or Path(model_dir).resolve().name,
        "r": recipe.rank,
        "lora_alpha": recipe.alpha if recipe.alpha is not None else 2 * recipe.rank,
        "target_modules": modules,
        "bias": "none",
        "task_type": "CAUSAL_LM",
    }
    return AdapterFiles(config=config, tensors=tensors)


def make_adapter(model_dir: Path, out_dir: Path, recipe: AdapterRecipe) -> Path:
    """Write the adapter as a PEFT directory `out_dir` (created; existing files replaced)."""
    files = adapter_files(model_dir, recipe).as_bytes()
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (out_dir / name).write_bytes(data)
    return out_dir
