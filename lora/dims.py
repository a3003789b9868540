"""The base model's projection shapes, as the LoRA side needs them (lora never imports engine;
the engine builds this from its ModelConfig)."""

from __future__ import annotations

from dataclasses import dataclass

ATTENTION_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_MODULES = ("gate_proj", "up_proj", "down_proj")
LORA_MODULES = ATTENTION_MODULES + MLP_MODULES


def parent_of(module: str) -> str:
    return "self_attn" if module in ATTENTION_MODULES else "mlp"


def module_key(layer: int, module: str) -> str:
    """The module's name inside the Hugging Face model, as PEFT's patterns see it."""
    return f"model.layers.{layer}.{parent_of(module)}.{module}"


@dataclass(frozen=True)
class BaseModelDims:
    num_layers: int
    hidden_size: int
    q_size: int  # num_heads * head_dim
    kv_size: int  # num_kv_heads * head_dim
    intermediate_size: int
    # Names the base model answers to (served name, checkpoint path); an adapter whose
    # base_model_name_or_path names another model is refused.
    names: tuple[str, ...] = ()

    def in_out(self, module: str) -> tuple[int, int]:
        """(in_features, out_features) of a projection."""
        h, q, kv, i = self.hidden_size, self.q_size, self.kv_size, self.intermediate_size
        return {
            "q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
            "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h),
        }[module]  # fmt: skip

    def module_names(self) -> list[str]:
        """Every module name of the model that a regex target_modules could match."""
        names = ["lm_head", "model.embed_tokens", "model.norm", "model.rotary_emb"]
        for layer in range(self.num_layers):
            names += [module_key(layer, m) for m in LORA_MODULES]
            prefix = f"model.layers.{layer}"
            names += [f"{prefix}.input_layernorm", f"{prefix}.post_attention_layernorm"]
            names += [f"{prefix}.self_attn", f"{prefix}.mlp", prefix]
        return names
