"""Upload validation: the LoRA loader's own checks (lora/adapter_format), run on the upload in
memory against the served base model, values included, before anything is written.

`AdapterValidator` is the seam the runtime takes; `FormatChecksValidator` is the one used. The
loader's AdapterError (a 400 naming the file, tensor, module or field) becomes AdapterRejected
here, the one place the two meet.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from lora.adapter_format import (
    CONFIG_FILE,
    LORA_MODULES,
    WEIGHTS_FILE,
    AdapterError,
    BytesSource,
    bundle_sha256,
    check_adapter,
)
from tenancy.adapters.base_model import base_model_dims
from tenancy.adapters.errors import AdapterRejected
from tenancy.settings import TenancySettings


@dataclass(frozen=True)
class LoraSpec:
    base_model: str
    # The largest module rank, as the engine reports it (rank_pattern may raise some modules'
    # ranks above r); alpha is lora_alpha, the default of alpha_pattern.
    rank: int
    alpha: float
    target_modules: tuple[str, ...]  # resolved short names, in LORA_MODULES order


@dataclass(frozen=True)
class ValidatedAdapter:
    spec: LoraSpec
    files: Mapping[str, bytes]
    sha256: str  # of its bundle (lora/adapter_format/bundle.py): its address in the store
    size_bytes: int


class AdapterValidator(Protocol):
    def validate(self, files: Mapping[str, bytes]) -> ValidatedAdapter:
        """Raise AdapterRejected (400 naming the problem) or return the adapter's facts."""
        ...


class FormatChecksValidator:
    def __init__(self, settings: TenancySettings) -> None:
        self._dims = base_model_dims(settings.base_model)
        self._limits = settings.adapter_limits

    def validate(self, files: Mapping[str, bytes]) -> ValidatedAdapter:
        weights = files[WEIGHTS_FILE]
        try:
            layout = check_adapter(
                files[CONFIG_FILE],
                BytesSource(weights),
                self._dims,
                max_rank=self._limits.max_rank,
                max_header_bytes=self._limits.max_safetensors_header_bytes,
            )
        except AdapterError as exc:
            # With several base models served, which one it was checked against matters.
            message = f"{exc.message} (checked against base model {self._dims.names[0][:200]!r})"
            raise AdapterRejected(message, param=exc.param or "file") from exc
        config = layout.config
        spec = LoraSpec(
            base_model=self._dims.names[0],
            rank=layout.rank,
            alpha=config.alpha,
            target_modules=tuple(m for m in LORA_MODULES if m in config.target_modules),
        )
        return ValidatedAdapter(
            spec=spec,
            files=files,
            sha256=bundle_sha256(files),
            size_bytes=sum(len(v) for v in files.values()),
        )
