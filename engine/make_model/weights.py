"""Seeded random weights chosen to make a useful test oracle, written as one safetensors file.

A random model is only a good oracle if a wrong implementation gives visibly wrong logits, so
the initialization is not the training-time one:

- q/k projections have a larger gain so attention scores spread (std ~2) and attention is far
  from uniform: a wrong mask, rotary embedding or head mapping moves the output. Qwen3 normalizes
  q and k per head, which would pin the score std at 1 whatever the projections; there the
  q_norm/k_norm weights carry the gain instead;
- every sub-layer writes into the residual stream at the scale of the stream itself, so each
  layer changes the output;
- the unembedding gives logits with std ~5 across the vocabulary, so the top-1 and top-2 logits
  differ by far more than float32 rounding and greedy decoding is stable across kernels;
- norm weights are 1 plus noise, so a norm that ignores its weight (or adds 1 to it) shows.

Each tensor draws from its own generator, seeded from the tensor's name, so adding or
renaming one tensor never changes another.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, PretrainedConfig

BASE_SEED = "loragate-make-model-v1"
# Logit std across the vocabulary for a unit-RMS final hidden state.
LOGIT_STD = 5.0
# Output std per unit-RMS input, as a multiple of 1/sqrt(fan_in).
QK_GAIN = 1.5
V_GAIN = 1.0
O_GAIN = 1.0
GATE_UP_GAIN = 1.0
DOWN_GAIN = 1.0
NORM_NOISE_STD = 0.05
BIAS_STD = 0.05


@dataclass(frozen=True)
class InitRule:
    mean: float
    std: float


def parameter_shapes(config: PretrainedConfig) -> dict[str, tuple[int, ...]]:
    """Names and shapes of the persistent tensors, exactly as transformers' state_dict has them.

    The model is built on the meta device: no memory, no init, only the module tree. A tied
    lm_head is the embedding under a second name, so it is not stored.
    """
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    shapes = {name: tuple(tensor.shape) for name, tensor in model.state_dict().items()}
    if config.tie_word_embeddings:
        shapes.pop("lm_head.weight", None)
    return dict(sorted(shapes.items()))


def count_parameters(config: PretrainedConfig) -> int:
    return sum(math.prod(shape) for shape in parameter_shapes(config).values())


def init_rule(name: str, shape: tuple[int, ...], config: PretrainedConfig) -> InitRule:
    if name in ("model.embed_tokens.weight", "lm_head.weight"):
        # The same std for both, so a tied checkpoint's logits match an untied one's in scale.
        return InitRule(0.0, LOGIT_STD / math.sqrt(config.hidden_size))
    if name.endswith(("q_norm.weight", "k_norm.weight")):
        return InitRule(QK_GAIN, NORM_NOISE_STD)
    if name.endswith("norm.weight"):
        return InitRule(1.0, NORM_NOISE_STD)
    if name.endswith(".bias"):
        return InitRule(0.0, BIAS_STD)
    gains = {
        "q_proj.weight": QK_GAIN,
        "k_proj.weight": QK_GAIN,
        "v_proj.weight": V_GAIN,
        "o_proj.weight": O_GAIN,
        "gate_proj.weight": GATE_UP_GAIN,
        "up_proj.weight": GATE_UP_GAIN,
        "down_proj.weight": DOWN_GAIN,
    }
    for suffix, gain in gains.items():
        if name.endswith(suffix):
            fan_in = shape[1]  # nn.Linear weight: [out_features, in_features]
            return InitRule(0.0, gain / math.sqrt(fan_in))
    raise ValueError(f"no init rule for tensor {name!r}; add one so its scale is deliberate")


def tensor_seed(name: str) -> int:
    digest = hashlib.sha256(f"{BASE_SEED}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def make_tensor(name: str, shape: tuple[int, ...], rule: InitRule) -> torch.Tensor:
    generator = torch.Generator(device="cpu").manual_seed(tensor_seed(name))
    tensor = torch.randn(shape, generator=generator, dtype=torch.float32)
    return tensor.mul_(rule.std).add_(rule.mean)


def make_state_dict(config: PretrainedConfig, *, num_tokens: int) -> dict[str, torch.Tensor]:
    """All weights in float32. Vocabulary rows past the tokenizer's `num_tokens` are zero.

    A zero lm_head row gives logit 0, far below the top logits, so greedy decoding never picks
    an id that the tokenizer cannot decode.
    """
    if not 0 < num_tokens <= config.vocab_size:
        raise ValueError(
            f"num_tokens must be in (0, vocab_size={config.vocab_size}], got {num_tokens}"
        )
    tensors = {}
    for name, shape in parameter_shapes(config).items():
        tensor = make_tensor(name, shape, init_rule(name, shape, config))
        if name in ("model.embed_tokens.weight", "lm_head.weight"):
            tensor[num_tokens:] = 0.0  # [vocab_size, hidden]
        tensors[name] = tensor
    return tensors


def write_weights(config: PretrainedConfig, path: Path, *, num_tokens: int) -> None:
    # safetensors orders the header itself; fixed metadata keeps the bytes reproducible.
    save_file(make_state_dict(config, num_tokens=num_tokens), str(path), metadata={"format": "pt"})
