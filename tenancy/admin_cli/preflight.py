"""Before an upload sends any weights: the local adapter_config.json and the files' sizes checked
against the server's limits (`GET /admin/v1/adapters/limits`), so an adapter the server would
refuse for its rank, its base model, its size or its name is refused here, at once, rather than
after a long upload.

Only what the config and the file sizes show is checked here; the server still checks
everything (tensor shapes and values, archive safety, ...), and its word is final. A config
that cannot be read here is left to the server, which names the problem.
"""

from __future__ import annotations

import dataclasses
import json
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CONFIG_FILE = "adapter_config.json"
MAX_CONFIG_BYTES = 1 << 20  # the server's own bound on adapter_config.json


@dataclass(frozen=True)
class UploadLimits:
    max_rank: int
    max_upload_bytes: int
    max_files: int
    max_name_length: int
    base_model: str  # the one an upload is checked against: the primary, or --base-model's
    base_models: tuple[str, ...] = ()  # every one the server serves (() from an older server)

    @classmethod
    def from_api(cls, data: dict[str, Any]) -> UploadLimits:
        return cls(
            max_rank=int(data["max_rank"]),
            max_upload_bytes=int(data["max_upload_bytes"]),
            max_files=int(data["max_files"]),
            max_name_length=int(data["max_name_length"]),
            base_model=str(data["base_model"]),
            base_models=tuple(str(m) for m in data.get("base_models", [data["base_model"]])),
        )

    def for_base_model(self, name: str | None) -> UploadLimits:
        """The limits an upload for `name` (None: the primary) is checked against; ValueError
        for a base model the server does not serve."""
        if name is None:
            return self
        if self.base_models and name not in self.base_models:
            served = ", ".join(repr(m[:200]) for m in self.base_models)
            raise ValueError(f"--base-model {name[:200]!r} is not served here (served: {served})")
        return dataclasses.replace(self, base_model=name)


def _read_member(source: Path) -> bytes | None:
    """adapter_config.json's bytes from a directory or an archive; None when absent or unreadable."""
    try:
        if source.is_dir():
            path = source / CONFIG_FILE
            return path.read_bytes() if path.is_file() else None
        if source.name.endswith(".zip"):
            with zipfile.ZipFile(source) as z:
                info = next((i for i in z.infolist() if i.filename.endswith(CONFIG_FILE)), None)
                if info is None or info.file_size > MAX_CONFIG_BYTES:
                    return None
                return z.read(info)
        with tarfile.open(source, "r:gz") as t:
            member = next((m for m in t if m.isfile() and m.name.endswith(CONFIG_FILE)), None)
            if member is None or member.size > MAX_CONFIG_BYTES:
                return None
            f = t.extractfile(member)
            return f.read() if f is not None else None
    except (OSError, zipfile.BadZipFile, tarfile.TarError):
        return None


def _tail(name: str) -> str:
    # As the server compares: a hub name and a local directory share their last component.
    return name.rstrip("/\\").replace("\\", "/").rsplit("/", 1)[-1].lower()


def _config_problems(config: dict[str, Any], limits: UploadLimits) -> list[str]:
    problems = []
    ranks = {"r": config.get("r")}
    pattern = config.get("rank_pattern")
    if isinstance(pattern, dict):
        ranks |= {f"rank_pattern[{k[:40]!r}]": v for k, v in pattern.items()}
    for field, rank in ranks.items():
        if isinstance(rank, int) and rank > limits.max_rank:
            problems.append(f"{field} is {rank}, above this server's max rank {limits.max_rank}")
    if config.get("peft_type") != "LORA":
        problems.append(f"peft_type is {str(config.get('peft_type'))[:40]!r}, not LORA")
    base = config.get("base_model_name_or_path")
    if isinstance(base, str) and limits.base_model and _tail(base) != _tail(limits.base_model):
        problems.append(
            f"base_model_name_or_path is {base[:200]!r}; this server serves "
            f"{limits.base_model[:200]!r}"
        )
    return problems


def check_upload(source: Path, files: list[Path], *, name: str, limits: UploadLimits) -> None:
    """ValueError, naming the field or file and the server's limit, for what the server would
    refuse; nothing when this side sees no problem."""
    problems = []
    if len(name) > limits.max_name_length:
        problems.append(f"--name is {len(name)} characters, above {limits.max_name_length}")
    size = sum(p.stat().st_size for p in files)
    if size > limits.max_upload_bytes:
        problems.append(f"the files are {size:,} bytes, above {limits.max_upload_bytes:,}")
    if source.is_dir() and len(files) > limits.max_files:
        problems.append(f"{len(files)} files, above {limits.max_files}")
    raw = _read_member(source)
    if raw is not None and len(raw) <= MAX_CONFIG_BYTES:
        try:
            config = json.loads(raw)
        except ValueError:
            config = None  # the server names what is wrong with it
        if isinstance(config, dict):
            problems += [f"{CONFIG_FILE}: {p}" for p in _config_problems(config, limits)]
    if problems:
        raise ValueError(
            f"{source} does not fit this server's adapter limits, nothing was sent: "
            + "; ".join(problems)
        )
