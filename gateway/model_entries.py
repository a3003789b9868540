"""Additional base models (LORAGATE_MODELS, JSON): each served beside the primary one with its
own engine pool, tokenizer, chat template and adapter shapes.

The primary model stays the single-model fields (`model`, `served_model_name`, `chat_template`,
`engine_*`, `engine`), so a gateway with one model needs no new setting. Each entry here is a
`ModelEntry`; `model_view` turns one into the settings its pool is built from: the gateway's own
settings with the model's fields replaced, so the engine builders, the tokenizer and the planner
read a model's settings exactly as they read the primary's. Refusals name the entry's field
(`models[1].path`).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tenancy.adapters.base_model import base_model_spec

if TYPE_CHECKING:
    from gateway.settings import GatewaySettings

# A served name is what `model` takes: never '@' (`name@N` names an adapter version); '/' as in
# Hugging Face names (`org/model`) is fine, /v1/models/{id} takes a path.
_SERVED_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:-]*")


class ModelEntry(BaseModel):
    """One more base model. `engine_urls` set: its own HTTP replicas (or vLLM servers, with
    `engine_kind`); unset: an in-process engine (the gateway's engine_mode must then be
    inprocess). `engine`: options over the gateway's `engine` settings for this model's engine
    (its `max_model_len`, `block_size` in HTTP mode; every option in process)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=256)
    path: Path
    chat_template: Path | None = None
    engine_urls: list[str] = Field(default_factory=list)
    engine_kind: Literal["loragate", "vllm"] | None = None
    engine: dict[str, Any] = Field(default_factory=dict)


def check_entries(settings: GatewaySettings) -> None:
    """ValueError naming the entry's field for the first entry that cannot be served."""
    seen = {settings.model_name}
    for index, entry in enumerate(settings.models):
        field = f"models[{index}]"
        if not _SERVED_NAME.fullmatch(entry.name) or "@" in entry.name:
            raise ValueError(
                f"{field}.name must be letters, digits and '._/:-' (no '@': name@N names an "
                "adapter version)"
            )
        if entry.name in seen:
            raise ValueError(f"{field}.name {entry.name!r} is served already (names are unique)")
        seen.add(entry.name)
        if (
            not (entry.path / "tokenizer_config.json").is_file()
            and not (entry.path / "tokenizer.json").is_file()
        ):
            raise ValueError(f"{field}.path must be a checkpoint directory with a tokenizer")
        if entry.chat_template is not None and not entry.chat_template.is_file():
            raise ValueError(f"{field}.chat_template must be a file (a Jinja chat template)")
        for url in entry.engine_urls:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"{field}.engine_urls must be http:// or https:// URLs")
        if not entry.engine_urls and settings.engine_mode == "http":
            raise ValueError(f"{field}.engine_urls: needed when engine_mode is 'http'")
        if not entry.engine_urls and entry.engine_kind == "vllm":
            raise ValueError(f"{field}.engine_kind 'vllm' needs {field}.engine_urls")
        try:
            settings.engine_for(entry)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise ValueError(f"{field}.engine.{where}: {first['msg']}") from None
        try:
            base_model_spec(entry.path, entry.name)
        except ValueError as exc:
            raise ValueError(f"{field}.path: {exc}") from None


def model_view(settings: GatewaySettings, entry: ModelEntry) -> GatewaySettings:
    """The settings the entry's pool is built from: the gateway's, with this model's fields."""
    urls = [url.rstrip("/") for url in entry.engine_urls]
    return settings.model_copy(
        update={
            "model": entry.path,
            "served_model_name": entry.name,
            "chat_template": entry.chat_template,
            "engine_mode": "http" if urls else "inprocess",
            "engine_urls": urls,
            "engine_kind": entry.engine_kind or ("loragate" if not urls else settings.engine_kind),
            "engine": settings.engine_for(entry),
            "base_model": base_model_spec(entry.path, entry.name),
            "models": [],
        }
    )
