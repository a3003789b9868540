"""Adapters made by PEFT itself on a generated base model, with seeded non-zero weights."""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch


@dataclass(frozen=True)
class AdapterSpec:
    name: str
    r: int
    alpha: float
    targets: Any = "all-linear"  # list, regex string or "all-linear"
    use_rslora: bool = False
    rank_pattern: dict[str, int] = field(default_factory=dict)
    alpha_pattern: dict[str, float] = field(default_factory=dict)
    seed: int = 0
    # std of the random B (PEFT initialises B to zero, which would make the adapter a no-op)
    b_std: float = 0.02


def load_base(model_dir: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()


def randomize(peft_model: Any, spec: AdapterSpec, adapter_name: str = "default") -> None:
    gen = torch.Generator().manual_seed(spec.seed)
    with torch.no_grad():
        for name, param in sorted(peft_model.named_parameters()):
            if f"lora_A.{adapter_name}." in name:
                bound = 1.0 / param.shape[1] ** 0.5
                param.copy_((torch.rand(param.shape, generator=gen) * 2 - 1) * bound)
            elif f"lora_B.{adapter_name}." in name:
                param.copy_(torch.randn(param.shape, generator=gen) * spec.b_std)


def make_peft_adapter(model_dir: Path, out: Path, spec: AdapterSpec) -> Path:
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=spec.r,
        lora_alpha=spec.alpha,
        target_modules=spec.targets,
        use_rslora=spec.use_rslora,
        rank_pattern=dict(spec.rank_pattern),
        alpha_pattern=dict(spec.alpha_pattern),
        lora_dropout=0.0,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = get_peft_model(load_base(model_dir), config)
        randomize(model, spec)
        model.save_pretrained(str(out))
    return out


def edit_config(adapter_dir: Path, **changes: Any) -> None:
    path = adapter_dir / "adapter_config.json"
    config = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    path.write_text(json.dumps(config))
