"""Check `adapter_config.json` against what the server can serve: LoRA only, the served base
model, rank within the maximum, attention / MLP projections only, nothing trained outside LoRA."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from tenancy.adapters.errors import AdapterRejected
from tenancy.settings import BaseModelSpec

ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")
TARGETS = ATTENTION + MLP
_MAX_REGEX = 256


@dataclass(frozen=True)
class LoraSpec:
    base_model: str
    rank: int
    alpha: float
    target_modules: tuple[str, ...]  # resolved short names, a subset of TARGETS


def _candidate_names(num_layers: int) -> list[str]:
    """Module names of a Llama-family model, for resolving a regex `target_modules`."""
    names = ["lm_head", "model.embed_tokens", "model.norm"]
    for i in range(num_layers):
        p = f"model.layers.{i}"
        names += [f"{p}.self_attn.{m}" for m in ATTENTION] + [f"{p}.mlp.{m}" for m in MLP]
        names += [f"{p}.input_layernorm", f"{p}.post_attention_layernorm"]
    return names


def _resolve_targets(value: Any, num_layers: int) -> tuple[str, ...]:
    if value == "all-linear":
        return TARGETS
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        unknown = sorted(set(value) - set(TARGETS))
        if unknown:
            raise AdapterRejected(
                f"Unknown target modules {unknown[:8]}; allowed: {list(TARGETS)}.",
                param="target_modules",
            )
        return tuple(m for m in TARGETS if m in value)
    if isinstance(value, str) and 0 < len(value) <= _MAX_REGEX:
        try:
            pattern = re.compile(value)
        except re.error as exc:
            raise AdapterRejected(
                "target_modules is not a valid regex.", param="target_modules"
            ) from exc
        matched = [n for n in _candidate_names(num_layers) if pattern.fullmatch(n)]
        short = {n.rsplit(".", 1)[-1] for n in matched}
        if not matched or not short <= set(TARGETS):
            raise AdapterRejected(
                f"target_modules regex must match only {list(TARGETS)}.", param="target_modules"
            )
        return tuple(m for m in TARGETS if m in short)
    raise AdapterRejected(
        "target_modules must be a list of module names, a regex or 'all-linear'.",
        param="target_modules",
    )


def parse_adapter_config(raw: bytes, *, base: BaseModelSpec, max_rank: int) -> LoraSpec:
    try:
        config = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise AdapterRejected(
            "adapter_config.json is not valid JSON.", param="adapter_config"
        ) from exc
    if not isinstance(config, dict):
        raise AdapterRejected("adapter_config.json must be an object.", param="adapter_config")
    if config.get("peft_type") != "LORA":
        raise AdapterRejected("peft_type must be LORA.", param="peft_type")
    if config.get("base_model_name_or_path") != base.name:
        raise AdapterRejected(
            f"base_model_name_or_path must be {base.name!r}.", param="base_model_name_or_path"
        )
    rank = config.get("r")
    if not isinstance(rank, int) or isinstance(rank, bool) or not 1 <= rank <= max_rank:
        raise AdapterRejected(f"Rank r must be between 1 and {max_rank}.", param="r")
    alpha = config.get("lora_alpha", rank)
    if not isinstance(alpha, int | float) or isinstance(alpha, bool) or not 0 < alpha <= 1e6:
        raise AdapterRejected("lora_alpha must be a positive number.", param="lora_alpha")
    if config.get("modules_to_save"):
        raise AdapterRejected("modules_to_save is not supported.", param="modules_to_save")
    if config.get("use_dora"):
        raise AdapterRejected("DoRA (use_dora) is not supported.", param="use_dora")
    for field in ("rank_pattern", "alpha_pattern", "layer_replication"):
        if config.get(field):
            raise AdapterRejected(f"{field} is not supported.", param=field)
    if config.get("bias", "none") != "none":
        raise AdapterRejected("Only bias='none' is supported.", param="bias")
    targets = _resolve_targets(config.get("target_modules"), base.num_hidden_layers)
    return LoraSpec(base_model=base.name, rank=rank, alpha=float(alpha), target_modules=targets)
