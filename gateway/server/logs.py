"""Logging for `loragate serve`: uvicorn's lines and the gateway's own, with secrets taken out.

Every log line, access lines included, passes `RedactSecrets`: query strings are cut (a client
may send `?api_key=...`; the gateway never reads keys from there) and anything shaped like an
API key is masked, wherever it appears. The gateway's own loggers (`gateway`, `tenancy`,
`engine`, ...) log at the chosen level through the same handler, so their INFO lines (a client
that left, a drain) are seen; httpx's per-request INFO lines are not.
"""

from __future__ import annotations

import logging
import re
from typing import Any

# A path's query string, as an access line or a message prints it.
_QUERY = re.compile(r'(/[^\s?"\']*)\?[^\s"\']+')


class RedactSecrets(logging.Filter):
    def __init__(self, key_prefix: str = "lg") -> None:
        super().__init__()
        self._key = re.compile(re.escape(key_prefix) + r"_[A-Za-z0-9_\-]{6,}")

    def clean(self, text: str) -> str:
        return self._key.sub("[key]", _QUERY.sub(r"\1?[query]", text))

    def filter(self, record: logging.LogRecord) -> bool:
        # The message and each argument on their own: formatters (uvicorn's access lines)
        # unpack the arguments, so their shape stays.
        if isinstance(record.msg, str):
            record.msg = self.clean(record.msg)
        if isinstance(record.args, tuple):
            record.args = tuple(self._arg(a) for a in record.args)
        elif isinstance(record.args, dict):
            record.args = {k: self._arg(v) for k, v in record.args.items()}
        return True

    def _arg(self, value: object) -> object:
        if isinstance(value, str):
            return self.clean(value)
        if isinstance(value, int | float | bool) or value is None:
            return value
        text = str(value)
        cleaned = self.clean(text)
        return value if cleaned == text else cleaned


def log_config(level: str, *, key_prefix: str) -> dict[str, Any]:
    """A `logging.config.dictConfig` for uvicorn's `log_config` (also applied in each worker)."""
    level = level.upper()
    redact = {"()": "gateway.server.logs.RedactSecrets", "key_prefix": key_prefix}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {"redact": redact},
        "formatters": {
            "default": {
                "()": "uvicorn.logging.DefaultFormatter",
                "fmt": "%(levelprefix)s %(name)s: %(message)s",
            },
            "access": {
                "()": "uvicorn.logging.AccessFormatter",
                "fmt": '%(levelprefix)s %(client_addr)s - "%(request_line)s" %(status_code)s',
            },
        },
        "handlers": {
            "default": {
                "class": "logging.StreamHandler",
                "formatter": "default",
                "filters": ["redact"],
                "stream": "ext://sys.stderr",
            },
            "access": {
                "class": "logging.StreamHandler",
                "formatter": "access",
                "filters": ["redact"],
                "stream": "ext://sys.stdout",
            },
        },
        "loggers": {
            "": {"handlers": ["default"], "level": level},
            "uvicorn": {"handlers": ["default"], "level": level, "propagate": False},
            "uvicorn.error": {"level": level},
            "uvicorn.access": {"handlers": ["access"], "level": level, "propagate": False},
            "httpx": {"level": "WARNING"},
            "httpcore": {"level": "WARNING"},
        },
    }
