"""The demo's LoRA adapters: PEFT-format directories with seeded random weights, written without
torch (numpy + safetensors), registered through the same validation as an admin upload."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors.numpy import save

from tenancy.adapters.archive import UploadedFile
from tenancy.adapters.validation import module_dims
from tenancy.settings import BaseModelSpec

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_PARENT = {m: "self_attn" if m.endswith(("q_proj", "k_proj", "v_proj", "o_proj")) else "mlp"
           for m in TARGETS}  # fmt: skip
# B's scale: large enough that a random adapter visibly changes what the tiny model writes.
B_STD = 0.2


def demo_adapter_files(base: BaseModelSpec, *, seed: int, rank: int = 8) -> list[UploadedFile]:
    """adapter_config.json and adapter_model.safetensors of one all-linear LoRA adapter."""
    rng = np.random.default_rng(seed)
    tensors: dict[str, np.ndarray] = {}
    for layer in range(base.num_hidden_layers):
        for module in TARGETS:
            d_in, d_out = module_dims(base, module)
            prefix = f"base_model.model.model.layers.{layer}.{_PARENT[module]}.{module}"
            a = rng.uniform(-1, 1, size=(rank, d_in)) / np.sqrt(d_in)  # [rank, in]
            b = rng.normal(0.0, B_STD, size=(d_out, rank))  # [out, rank]
            tensors[f"{prefix}.lora_A.weight"] = a.astype(np.float32)
            tensors[f"{prefix}.lora_B.weight"] = b.astype(np.float32)
    config = {
        "peft_type": "LORA",
        "base_model_name_or_path": base.name,
        "r": rank,
        "lora_alpha": 2 * rank,
        "target_modules": list(TARGETS),
        "bias": "none",
        "task_type": "CAUSAL_LM",
    }
    return [
        UploadedFile(filename="adapter_config.json", data=json.dumps(config, indent=2).encode()),
        UploadedFile(filename="adapter_model.safetensors", data=save(tensors)),
    ]


def write_demo_adapter(out: Path, base: BaseModelSpec, *, seed: int, rank: int = 8) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    for upload in demo_adapter_files(base, seed=seed, rank=rank):
        (out / upload.filename).write_bytes(upload.data)
    return out
