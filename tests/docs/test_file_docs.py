"""Every repository path README.md and docs/ name in backticks or link to exists, and every
link's heading too (see docs_reading.py)."""

from __future__ import annotations

import re
from pathlib import Path

from tests.docs.docs_reading import ROOT, doc_files, inline_code, rel, without_fences

# Paths that exist only once something has run (created at run time, ignored by git).
RUNTIME_PATHS = (".cache/", ".venv/", "data/", "bench/out/")
PATH_SUFFIXES = (".py", ".md", ".yml", ".yaml", ".toml")


def repository_path(code: str) -> str | None:
    """The repository path an inline code span names, or None if it is not one."""
    text = code.strip()
    if not text or any(c in text for c in " <>{}=$\"'") or "://" in text:
        return None
    if text.startswith(("/", "-", "~")):
        return None  # a URL path, a flag, a home directory: not the repository
    candidate = text.removeprefix("./")
    if candidate.startswith(RUNTIME_PATHS):
        return None
    if text.startswith("../") or candidate.endswith(PATH_SUFFIXES):
        return text
    if "/" in candidate and (ROOT / candidate.split("/", 1)[0]).exists():
        return text  # under a top-level entry of the repository
    return None


def _slug(heading: str) -> str:
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    lines = without_fences(path.read_text(encoding="utf-8")).splitlines()
    return {_slug(line.lstrip("#")) for line in lines if re.match(r"#{1,6} ", line)}


def test_every_file_the_docs_name_exists() -> None:
    missing = []
    for doc in doc_files():
        for number, code in inline_code(doc):
            name = repository_path(code)
            if name is None:
                continue
            target = (ROOT / name).resolve() if not name.startswith("../") else None
            exists = target is not None and (
                any(ROOT.glob(name)) if "*" in name else target.exists()
            )
            if not exists:
                missing.append(f"  {rel(doc)}:{number}: `{code}`")
        text = without_fences(doc.read_text(encoding="utf-8"))
        for match in re.finditer(r"\]\(([^)\s]+)\)", text):
            link = match.group(1)
            if re.match(r"[a-z]+:", link):
                continue  # http:, https:, mailto:
            number = text.count("\n", 0, match.start()) + 1
            file_part, _, anchor = link.partition("#")
            target = (doc.parent / file_part).resolve() if file_part else doc
            if not target.exists() or ROOT not in (target, *target.parents):
                missing.append(f"  {rel(doc)}:{number}: link ({link})")
            elif anchor and target.suffix == ".md" and anchor not in _anchors(target):
                missing.append(f"  {rel(doc)}:{number}: link ({link}): no such heading")
    assert not missing, (
        "paths named in the docs that do not exist in the repository:\n" + "\n".join(missing)
    )
