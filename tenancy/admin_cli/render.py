"""Output: tables for people (rich), JSON for scripts (`--json`: the API's own answer)."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

Column = tuple[str, str]  # (field, header)


def as_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=True) + "\n")


def _cell(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:,.1f}"  # seconds to a reset, rates: 0.1 is enough for a person
    if isinstance(value, list):
        return ", ".join(str(v) for v in value) or "—"
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in sorted(value.items())) or "—"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def table(
    rows: Sequence[dict[str, Any]],
    columns: Sequence[Column],
    *,
    title: str = "",
    stderr: bool = False,
) -> None:
    """`stderr`: for the person while stdout carries something for a pipe (a new key)."""
    console = Console(soft_wrap=False, stderr=stderr)
    out = Table(title=title or None, show_lines=False, header_style="bold")
    for field, header in columns:
        numeric = any(isinstance(r.get(field), int | float) for r in rows)
        out.add_column(header, justify="right" if numeric else "left", overflow="fold")
    for row in rows:
        out.add_row(*(_cell(row.get(field)) for field, _ in columns))
    console.print(out)
    if not rows:
        console.print("(none)")


def record(data: dict[str, Any], columns: Sequence[Column], *, stderr: bool = False) -> None:
    table([{"field": header, "value": _cell(data.get(f))} for f, header in columns],
          [("field", "field"), ("value", "value")], stderr=stderr)  # fmt: skip


def note(text: str) -> None:
    """A line for the person, on stderr (stdout stays clean for pipes)."""
    Console(stderr=True).print(text)
