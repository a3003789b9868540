"""The served model's projection shapes, read from its checkpoint's `config.json` (no weights).

Uploads are checked against these, so they must be the served checkpoint's, never a default.
Spellings accepted are those engine/models/hf_config.py accepts, plus nesting: transformers 5.x
writes a multimodal model's language model under `text_config`, and its fields win over the
top level's. `head_dim` missing or null means hidden_size // num_attention_heads, and
`num_key_value_heads` missing or null means num_attention_heads (no grouped-query attention).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lora.dims import BaseModelDims

MAX_CONFIG_BYTES = 1 << 20


@dataclass(frozen=True)
class CheckpointShape:
    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int

    def dims(self, names: tuple[str, ...] = ()) -> BaseModelDims:
        return BaseModelDims(
            num_layers=self.num_layers,
            hidden_size=self.hidden_size,
            q_size=self.num_heads * self.head_dim,
            kv_size=self.num_kv_heads * self.head_dim,
            intermediate_size=self.intermediate_size,
            names=names,
        )


def _positive_int(config: Mapping[str, Any], field: str, default: int | None = None) -> int:
    value = config.get(field)
    if value is None and default is not None:
        return default
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"config.json: {field} must be a positive integer, got {value!r:.40}")
    return value


def parse_checkpoint_shape(raw: Mapping[str, Any]) -> CheckpointShape:
    """ValueError naming the field when one is missing or not a positive integer."""
    text = raw.get("text_config")
    config = {**raw, **text} if isinstance(text, dict) else raw
    hidden = _positive_int(config, "hidden_size")
    num_heads = _positive_int(config, "num_attention_heads")
    return CheckpointShape(
        num_layers=_positive_int(config, "num_hidden_layers"),
        hidden_size=hidden,
        intermediate_size=_positive_int(config, "intermediate_size"),
        num_heads=num_heads,
        num_kv_heads=_positive_int(config, "num_key_value_heads", default=num_heads),
        head_dim=_positive_int(config, "head_dim", default=max(1, hidden // num_heads)),
    )


def read_checkpoint_shape(model_dir: Path) -> CheckpointShape:
    """ValueError when `model_dir/config.json` is missing, unreadable or lacks a shape field."""
    path = Path(model_dir) / "config.json"
    try:
        size = path.stat().st_size
        data = path.read_bytes() if size <= MAX_CONFIG_BYTES else b""
    except OSError as exc:
        raise ValueError(
            f"{path} cannot be read: uploads are checked against the shapes of the served "
            "checkpoint, from its config.json"
        ) from exc
    if size > MAX_CONFIG_BYTES:
        raise ValueError(f"{path} is larger than {MAX_CONFIG_BYTES} bytes")
    try:
        raw = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"{path} is not valid JSON") from exc
    if not isinstance(raw, dict):
        raise ValueError(f"{path} is not a JSON object")
    return parse_checkpoint_shape(raw)
