"""A state directory: the embedded deployment's files in one place (what `loragate demo` uses,
and what `loragate admin ... --dir` reads).

    DIR/secrets.env    LORAGATE_KEY_PEPPER and LORAGATE_SALT_SECRET, generated once (0600)
    DIR/loragate.db    the SQLite database
    DIR/adapters/      the adapter store

The secrets are kept, not regenerated, so keys stay valid across restarts.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

SECRETS_FILE = "secrets.env"
DATABASE_FILE = "loragate.db"
ADAPTERS_DIR = "adapters"


class NoStateDir(ValueError):
    """The directory holds no state (nothing has created it yet)."""


def state_settings(state_dir: Path, *, create: bool) -> dict[str, str]:
    """Settings values (field names) for the state in `state_dir`; with `create`, the secrets
    are generated on first use, else a missing directory raises NoStateDir."""
    path = state_dir / SECRETS_FILE
    if not path.exists():
        if not create:
            raise NoStateDir(f"{path} does not exist: run `loragate demo` (or `make run`) first")
        state_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(f"LORAGATE_KEY_PEPPER={secrets.token_urlsafe(32)}\n")
            f.write(f"LORAGATE_SALT_SECRET={secrets.token_urlsafe(32)}\n")
    values = {}
    for line in path.read_text().splitlines():
        name, _, value = line.partition("=")
        if name.startswith("LORAGATE_"):
            values[name.removeprefix("LORAGATE_").lower()] = value
    values["database_url"] = f"sqlite+aiosqlite:///{(state_dir / DATABASE_FILE).resolve()}"
    values["adapter_store_dir"] = str(state_dir / ADAPTERS_DIR)
    return values
