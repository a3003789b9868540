"""Where the CLI finds the admin API and its key. The key is never a command-line argument (it
would sit in the shell history and in `ps`). In order:

1. `LORAGATE_ADMIN_URL` and `LORAGATE_ADMIN_KEY` from the environment;
2. a profile in the profile file (`LORAGATE_ADMIN_PROFILES`, default
   `~/.config/loragate/admin-profiles.json`), chosen by `--profile` or `LORAGATE_ADMIN_PROFILE`
   (default `default`). `loragate admin login` writes it.

The file holds keys, so it must be the caller's own and readable by nobody else: it is written
with mode 0600, and a file that group or others may read is refused (as ssh refuses a private
key), naming the file and the fix.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path

DEFAULT_PROFILE = "default"
URL_VAR, KEY_VAR = "LORAGATE_ADMIN_URL", "LORAGATE_ADMIN_KEY"
PROFILE_VAR, PROFILES_VAR = "LORAGATE_ADMIN_PROFILE", "LORAGATE_ADMIN_PROFILES"
# The CLI's own environment (a client's, not the gateway's settings).
ENVIRONMENT = (URL_VAR, KEY_VAR, PROFILE_VAR, PROFILES_VAR)


class ProfileError(Exception):
    pass


@dataclass(frozen=True)
class Target:
    url: str
    key: str
    source: str  # "environment" or "profile NAME in FILE", for messages (never the key)


def profiles_path() -> Path:
    configured = os.environ.get(PROFILES_VAR)
    if configured:
        return Path(configured)
    return Path.home() / ".config" / "loragate" / "admin-profiles.json"


def _read(path: Path) -> dict[str, dict[str, str]]:
    if not path.exists():
        return {}
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        raise ProfileError(
            f"{path} is readable by others (mode {mode:04o}); it holds API keys: chmod 600 {path}"
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise ProfileError(f"{path} is not valid JSON ({exc.__class__.__name__})") from None
    if not isinstance(data, dict):
        raise ProfileError(f"{path} must hold an object of profiles")
    return data


def resolve(profile: str | None) -> Target:
    url, key = os.environ.get(URL_VAR), os.environ.get(KEY_VAR)
    if url and key and profile is None:
        return Target(url=url, key=key, source="environment")
    name = profile or os.environ.get(PROFILE_VAR) or DEFAULT_PROFILE
    path = profiles_path()
    entry = _read(path).get(name)
    if entry is None:
        missing = [n for n, v in ((URL_VAR, url), (KEY_VAR, key)) if not v]
        raise ProfileError(
            f"no admin API configured: set {' and '.join(missing) or 'LORAGATE_ADMIN_*'}, "
            f"or save profile {name!r} with `loragate admin login --url URL` ({path})"
        )
    if not entry.get("url") or not entry.get("key"):
        raise ProfileError(f"profile {name!r} in {path} needs both url and key")
    return Target(url=entry["url"], key=entry["key"], source=f"profile {name!r} in {path}")


def save(name: str, url: str, key: str) -> Path:
    path = profiles_path()
    profiles = _read(path)
    profiles[name] = {"url": url.rstrip("/"), "key": key}
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(profiles, f, indent=2)
    os.chmod(tmp, 0o600)
    tmp.replace(path)
    return path
