"""Every log record of a block of tests, as text, for the scans that no key, salt or prompt leaks."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager


class _CaptureAll(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage()
        except Exception:  # a malformed record is still scanned by its raw parts
            text = f"{record.msg!r} {record.args!r}"
        self.lines.append(f"{text} {record.exc_text or ''}")


@contextmanager
def captured_log_lines() -> Iterator[list[str]]:
    """Attach to the root logger at DEBUG; the list fills while the block runs."""
    handler = _CaptureAll()
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        yield handler.lines
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)
