"""Load a local Hugging Face checkpoint (single or sharded safetensors) into LlamaForCausalLM.

The checkpoint's separate q/k/v and gate/up weights are concatenated into the model's fused
projections. Pickle checkpoints (.bin/.pt) are never read.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from safetensors import safe_open

from engine.models.hf_config import ModelConfig
from engine.models.llama import LlamaForCausalLM
from engine.models.rope import RotaryEmbedding

_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
# checkpoint suffix -> (fused parameter, shard index); shard order is the concatenation order
_FUSED = {
    "self_attn.q_proj": ("self_attn.qkv_proj", 0),
    "self_attn.k_proj": ("self_attn.qkv_proj", 1),
    "self_attn.v_proj": ("self_attn.qkv_proj", 2),
    "mlp.gate_proj": ("mlp.gate_up_proj", 0),
    "mlp.up_proj": ("mlp.gate_up_proj", 1),
}


def safetensors_files(model_dir: Path) -> list[Path]:
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return [model_dir / name for name in sorted(set(weight_map.values()))]
    single = model_dir / "model.safetensors"
    if single.is_file():
        return [single]
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(
            f"no safetensors weights in {model_dir} (pickle checkpoints are not read)"
        )
    return files


def _target_name(name: str) -> tuple[str, int | None]:
    """Map a checkpoint tensor name to (model parameter name, fused shard index or None)."""
    match = _LAYER.match(name)
    if match is None:
        return name.removeprefix("model."), None
    layer, rest = match.groups()
    module, _, kind = rest.rpartition(".")
    if module in _FUSED:
        fused, shard = _FUSED[module]
        return f"layers.{layer}.{fused}.{kind}", shard
    return f"layers.{layer}.{rest}", None


def load_model(
    model_dir: str | Path,
    config: ModelConfig,
    *,
    dtype: torch.dtype,
    device: torch.device,
    max_positions: int,
) -> LlamaForCausalLM:
    path = Path(model_dir)
    rotary = RotaryEmbedding(config.rope, config.head_dim, max_positions, device)
    # Build on the meta device (no memory, no random init), then allocate in the target dtype.
    with torch.device("meta"):
        model = LlamaForCausalLM(config, rotary)
    model = model.to_empty(device=device).to(dtype)
    if config.tie_word_embeddings:
        # to_empty() allocates each parameter separately, which unties shared weights.
        model.lm_head.weight = model.embed_tokens.weight
    params = dict(model.named_parameters(remove_duplicate=False))
    pending: dict[str, dict[int, torch.Tensor]] = {}
    loaded: set[str] = set()
    for file in safetensors_files(path):
        with safe_open(str(file), framework="pt", device="cpu") as reader:
            for name in reader.keys():  # noqa: SIM118 (safe_open is not a mapping)
                if "rotary_emb" in name:
                    continue
                target, shard = _target_name(name)
                if target not in params:
                    raise ValueError(f"unexpected tensor {name!r} in {file.name}")
                tensor = reader.get_tensor(name)
                if shard is None:
                    _copy(params[target], tensor, name)
                    loaded.add(target)
                else:
                    pending.setdefault(target, {})[shard] = tensor
    for target, shards in pending.items():
        fused = torch.cat([shards[i] for i in sorted(shards)], dim=0)
        _copy(params[target], fused, target)
        loaded.add(target)
    if config.tie_word_embeddings:
        loaded.add("lm_head.weight")
    missing = sorted(set(params) - loaded)
    if missing:
        raise ValueError(f"checkpoint is missing tensors: {missing[:8]}")
    return model.eval()


def _copy(param: torch.nn.Parameter, tensor: torch.Tensor, name: str) -> None:
    if param.shape != tensor.shape:
        raise ValueError(
            f"tensor {name!r} has shape {tuple(tensor.shape)}, expected {tuple(param.shape)}"
        )
    with torch.no_grad():
        param.copy_(tensor.to(param.dtype))
