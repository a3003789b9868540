"""Parse and check a PEFT `adapter_config.json` against what the engine can serve.

LoRA only, on the seven Llama projections, rank within max_lora_rank, nothing trained outside
LoRA and no LoRA variant that changes the forward pass (DoRA, aLoRA, QA-LoRA, lora bias...).
Per-module rank and alpha follow PEFT exactly: `rank_pattern` / `alpha_pattern` keys are
regexes matched as `(.*\\.)?(key)$` against the module's name, first match wins, and the scale
is alpha / r (alpha / sqrt(r) with `use_rslora`). Uploads accept the patterns too: the engine
serves modules of different ranks in one adapter, so refusing them at upload only turned away
adapters the engine would serve.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

from lora.dims import LORA_MODULES, BaseModelDims
from lora.errors import (
    AdapterBaseModelError,
    AdapterConfigError,
    AdapterFormatError,
    AdapterRankError,
    AdapterTargetError,
)

CONFIG_FILE = "adapter_config.json"
MAX_CONFIG_BYTES = 1 << 20
MAX_PATTERN_LEN = 256
MAX_PATTERNS = 4096
# Fields that make PEFT compute something other than x @ A.T @ B.T * scale, or train weights
# outside LoRA: any truthy value is refused.
_UNSUPPORTED = {
    "use_dora": "DoRA (use_dora)",
    "modules_to_save": "modules_to_save",
    "layer_replication": "layer_replication",
    "lora_bias": "lora_bias",
    "fan_in_fan_out": "fan_in_fan_out",
    "target_parameters": "target_parameters",
    "trainable_token_indices": "trainable_token_indices",
    "alora_invocation_tokens": "aLoRA (alora_invocation_tokens)",
    "use_qalora": "QA-LoRA (use_qalora)",
    "arrow_config": "arrow_config",
    "velora_config": "velora_config",
    "monteclora_config": "monteclora_config",
    "use_bdlora": "use_bdlora",
    "kasa_config": "kasa_config",
}


@dataclass(frozen=True)
class PeftLoraConfig:
    rank: int
    alpha: float
    use_rslora: bool
    rank_pattern: tuple[tuple[str, int], ...]
    alpha_pattern: tuple[tuple[str, float], ...]
    target_modules: frozenset[str]  # short names, a subset of LORA_MODULES
    base_model_name: str | None

    def module_rank(self, key: str) -> int:
        return _first_match(self.rank_pattern, key, self.rank)

    def module_scale(self, key: str) -> float:
        rank = self.module_rank(key)
        alpha = _first_match(self.alpha_pattern, key, self.alpha)
        return alpha / math.sqrt(rank) if self.use_rslora else alpha / rank


def _first_match(patterns: tuple[tuple[str, Any], ...], key: str, default: Any) -> Any:
    for pattern, value in patterns:
        if re.match(rf"(.*\.)?({pattern})$", key):
            return value
    return default


def parse_config_json(raw: bytes) -> dict[str, Any]:
    """The JSON object of an `adapter_config.json` (the caller reads the file)."""
    if len(raw) > MAX_CONFIG_BYTES:
        raise AdapterFormatError(f"{CONFIG_FILE} is larger than {MAX_CONFIG_BYTES} bytes")
    try:
        config = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise AdapterFormatError(f"{CONFIG_FILE} is not valid JSON") from exc
    if not isinstance(config, dict):
        raise AdapterFormatError(f"{CONFIG_FILE} must be a JSON object")
    return config


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _rank(value: Any, field: str, max_rank: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise AdapterConfigError(f"{field} must be a positive integer", param=field)
    if value > max_rank:
        raise AdapterRankError(
            f"{field} is {value}, above this server's max_lora_rank {max_rank}", param=field
        )
    return value


def _alpha(value: Any, field: str) -> float:
    if not _is_number(value) or not 0 < value <= 1e6:
        raise AdapterConfigError(f"{field} must be a positive number", param=field)
    return float(value)


def _patterns(raw: Any, field: str) -> list[tuple[str, Any]]:
    if raw is None:
        return []
    if not isinstance(raw, dict) or len(raw) > MAX_PATTERNS:
        raise AdapterConfigError(
            f"{field} must be an object of at most {MAX_PATTERNS} keys", param=field
        )
    out = []
    for key, value in raw.items():
        if not 0 < len(key) <= MAX_PATTERN_LEN:
            raise AdapterConfigError(
                f"{field} keys must be 1..{MAX_PATTERN_LEN} characters", param=field
            )
        try:
            re.compile(key)
        except re.error as exc:
            raise AdapterConfigError(
                f"{field} key {key[:60]!r} is not a valid regex", param=field
            ) from exc
        out.append((key, value))
    return out


def _targets(value: Any, dims: BaseModelDims) -> frozenset[str]:
    if value == "all-linear":
        return frozenset(LORA_MODULES)
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        short = {v.rsplit(".", 1)[-1] for v in value}
        unknown = sorted(short - set(LORA_MODULES))
        if unknown:
            raise AdapterTargetError(
                f"unknown target modules {[u[:40] for u in unknown[:8]]}; allowed: {list(LORA_MODULES)}",
                param="target_modules",
            )
        return frozenset(short)
    if isinstance(value, str) and 0 < len(value) <= MAX_PATTERN_LEN:
        try:
            pattern = re.compile(value)
        except re.error as exc:
            raise AdapterTargetError(
                "target_modules is not a valid regex", param="target_modules"
            ) from exc
        matched = [n for n in dims.module_names() if pattern.fullmatch(n)]
        short = {n.rsplit(".", 1)[-1] for n in matched}
        if not matched or not short <= set(LORA_MODULES):
            raise AdapterTargetError(
                f"the target_modules regex must match only {list(LORA_MODULES)}",
                param="target_modules",
            )
        return frozenset(short)
    raise AdapterTargetError(
        "target_modules must be a list of module names, a regex or 'all-linear'",
        param="target_modules",
    )


def _check_base_model(name: Any, dims: BaseModelDims) -> str | None:
    # No name (PEFT writes none for a model built from a config) is not a mismatch: the tensor
    # shapes are checked against the base model either way, and they are what must fit.
    if name is None or not dims.names:
        return None
    if not isinstance(name, str):
        raise AdapterConfigError(
            "base_model_name_or_path must be a string", param="base_model_name_or_path"
        )

    # A hub name and a local directory of the same model share their last path component.
    def tail(s: str) -> str:
        return s.rstrip("/\\").replace("\\", "/").rsplit("/", 1)[-1].lower()

    if tail(name) not in {tail(n) for n in dims.names if n}:
        raise AdapterBaseModelError(
            f"base_model_name_or_path: the adapter was made for base model {name[:200]!r}, "
            f"not for this server's {dims.names[0][:200]!r}",
            param="base_model_name_or_path",
        )
    return name


def parse_peft_config(raw: dict[str, Any], dims: BaseModelDims, *, max_rank: int) -> PeftLoraConfig:
    if raw.get("peft_type") != "LORA":
        raise AdapterConfigError(
            f"peft_type must be LORA, got {str(raw.get('peft_type'))[:40]!r}", param="peft_type"
        )
    for field, label in _UNSUPPORTED.items():
        if raw.get(field):
            raise AdapterConfigError(f"{label} is not supported", param=field)
    if raw.get("bias", "none") != "none":
        raise AdapterConfigError("only bias='none' is supported", param="bias")
    base_name = _check_base_model(raw.get("base_model_name_or_path"), dims)
    rank = _rank(raw.get("r"), "r", max_rank)
    alpha = _alpha(raw.get("lora_alpha", rank), "lora_alpha")
    use_rslora = raw.get("use_rslora", False)
    if not isinstance(use_rslora, bool):
        raise AdapterConfigError("use_rslora must be a boolean", param="use_rslora")
    rank_pattern = tuple(
        (k, _rank(v, f"rank_pattern[{k[:40]!r}]", max_rank))
        for k, v in _patterns(raw.get("rank_pattern"), "rank_pattern")
    )
    alpha_pattern = tuple(
        (k, _alpha(v, f"alpha_pattern[{k[:40]!r}]"))
        for k, v in _patterns(raw.get("alpha_pattern"), "alpha_pattern")
    )
    return PeftLoraConfig(
        rank=rank,
        alpha=alpha,
        use_rslora=use_rslora,
        rank_pattern=rank_pattern,
        alpha_pattern=alpha_pattern,
        target_modules=_targets(raw.get("target_modules"), dims),
        base_model_name=base_name,
    )
