"""The demo's LoRA adapters: PEFT-format directories with seeded random weights, written without
torch (numpy + safetensors), registered through the same validation as an admin upload.

Shapes come from the served checkpoint (its config.json, through the settings' `base_model` or
`write_demo_adapter`'s model directory) and the tensor names and shapes from the adapter format
the engine loads with, so every adapter made here is one the demo serves.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors.numpy import save

from tenancy.adapters.archive import UploadedFile
from tenancy.adapters.base_model import LORA_MODULES, base_model_spec, lora_tensor_shapes
from tenancy.settings import BaseModelSpec

# B's scale: large enough that a random adapter visibly changes what the tiny model writes.
B_STD = 0.2


def demo_adapter_files(base: BaseModelSpec, *, seed: int, rank: int = 8) -> list[UploadedFile]:
    """adapter_config.json and adapter_model.safetensors of one all-linear LoRA adapter."""
    rng = np.random.default_rng(seed)
    tensors: dict[str, np.ndarray] = {}
    for name, shape in lora_tensor_shapes(base, rank=rank).items():
        if name.endswith(".lora_A.weight"):
            d_in = shape[1]
            values = rng.uniform(-1, 1, size=shape) / np.sqrt(d_in)  # [rank, in]
        else:
            values = rng.normal(0.0, B_STD, size=shape)  # [out, rank]
        tensors[name] = values.astype(np.float32)
    config = {
        "peft_type": "LORA",
        "base_model_name_or_path": base.name,
        "r": rank,
        "lora_alpha": 2 * rank,
        "target_modules": list(LORA_MODULES),
        "bias": "none",
        "task_type": "CAUSAL_LM",
    }
    return [
        UploadedFile(filename="adapter_config.json", data=json.dumps(config, indent=2).encode()),
        UploadedFile(filename="adapter_model.safetensors", data=save(tensors)),
    ]


def write_demo_adapter(
    out: Path, model_dir: Path, *, name: str | None = None, seed: int, rank: int = 8
) -> Path:
    """A demo adapter for the checkpoint in `model_dir` (served as `name`, by default the
    directory's name), written as a PEFT directory under `out`."""
    base = base_model_spec(model_dir, name or Path(model_dir).resolve().name)
    out.mkdir(parents=True, exist_ok=True)
    for upload in demo_adapter_files(base, seed=seed, rank=rank):
        (out / upload.filename).write_bytes(upload.data)
    return out
