"""Reading README.md and docs/ for the documentation tests of this directory (issue 10,
acceptance 5): the docs name only settings, routes, files and metrics that exist, and the code
cites no documentation that lives outside the repository.

- Settings (test_settings_docs.py): the settings table of docs/operations.md lists exactly the
  environment variables `GatewaySettings` reads (derived from `model_fields`, nested models
  recursively: a nested field is both `LORAGATE_FIELD` as JSON and `LORAGATE_FIELD__SUB`), with
  the code's defaults; every `LORAGATE_*` named anywhere in README.md or docs/ exists.
- Routes (test_route_docs.py): every route the gateway app serves is listed in
  docs/openai-api.md and every route of the engine server in docs/tokens-api.md (written
  "`GET /v1/models`"); every route the docs name exists.
- Files (test_file_docs.py): every repository path in backticks (or a relative link) in
  README.md and docs/ exists.
- Metrics (test_metric_docs.py): the metrics tables of docs/operations.md list exactly what the
  gateway and the engine export; every metric named anywhere in the docs exists.
- Docstrings (test_citations.py): no module under engine/, gateway/, tenancy/, lora/, kernels/
  or bench/ cites `spec/`, `../shared` or the team's working notes (DESIGN.md, STYLE.md,
  SECURITY.md): readers of the repository never see them; docs/ is the documentation.

Each failure names exactly what is missing or extra, with the file and line where it applies.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
DOCS = ROOT / "docs"
README = ROOT / "README.md"
OPERATIONS = DOCS / "operations.md"
OPENAI_API = DOCS / "openai-api.md"
TOKENS_API = DOCS / "tokens-api.md"


def doc_files() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def without_fences(text: str) -> str:
    """The text with fenced code blocks blanked (line numbers kept), so inline code pairs up."""
    out, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            out.append("")
            continue
        out.append("" if fenced else line)
    return "\n".join(out)


def inline_code(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, content) of every inline code span outside fenced blocks."""
    text = without_fences(path.read_text(encoding="utf-8"))
    for match in re.finditer(r"`([^`]+)`", text):
        yield text.count("\n", 0, match.start()) + 1, match.group(1)


def section(path: Path, heading: str) -> list[tuple[int, str]]:
    """(line number, line) of the `## heading` section, up to the next level-2 heading."""
    lines = path.read_text(encoding="utf-8").splitlines()
    out: list[tuple[int, str]] = []
    inside = False
    for number, line in enumerate(lines, start=1):
        if line.startswith("## "):
            inside = line[3:].strip() == heading
            continue
        if inside:
            out.append((number, line))
    assert out, f"{rel(path)} has no '## {heading}' section"
    return out


def cells(line: str) -> list[str]:
    """A markdown table row's cells (`\\|` is a literal bar)."""
    parts = re.split(r"(?<!\\)\|", line.strip().strip("|"))
    return [part.strip().replace("\\|", "|") for part in parts]


def first_cell_names(rows: list[tuple[int, str]], pattern: str) -> dict[str, list[tuple[int, str]]]:
    """name -> [(line, other cells joined)] for table rows whose first cell is one `name`."""
    found: dict[str, list[tuple[int, str]]] = {}
    for number, line in rows:
        if not line.lstrip().startswith("|"):
            continue
        row = cells(line)
        match = re.fullmatch(r"`(" + pattern + r")`", row[0])
        if match:
            found.setdefault(match.group(1), []).append((number, "|".join(row[1:])))
    return found
