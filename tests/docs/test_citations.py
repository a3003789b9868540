"""No module of the product cites documentation that lives outside the repository (see
docs_reading.py)."""

from __future__ import annotations

import re

from tests.docs.docs_reading import ROOT, rel

# Packages whose modules must not cite material outside the repository.
CODE_PACKAGES = ("engine", "gateway", "tenancy", "lora", "kernels", "bench")
OUTSIDE_DOCS = re.compile(
    r"(?<![\w-])spec/|\.\./shared|(?<![\w-])shared/spec\b|\b(?:DESIGN|STYLE|SECURITY)\.md\b"
)


def test_no_module_cites_documentation_outside_the_repository() -> None:
    offenders = []
    for package in CODE_PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            text = path.read_text(encoding="utf-8")
            for number, line in enumerate(text.splitlines(), start=1):
                if OUTSIDE_DOCS.search(line):
                    offenders.append(f"  {rel(path)}:{number}: {line.strip()}")
    assert not offenders, (
        "modules cite documentation outside the repository (cite docs/*.md instead):\n"
        + "\n".join(offenders)
    )
