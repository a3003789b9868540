"""bench/RESULTS.md states the current figures only (issue 47): under 500 lines, every table row
naming the commit it was measured at, every section naming the script that produces it. The
run-by-run history lives in bench/history/ and in git."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "RESULTS.md"
MAX_LINES = 500
COMMIT = re.compile(r"\b[0-9a-f]{7,40}\b")
NOT_RECORDED = "commit not recorded"
SEPARATOR = re.compile(r"^\|\s*:?-{3,}")
SCRIPT = re.compile(r"\bbench/(\w+)\.py\b")


def rows_without_commit(text: str) -> list[str]:
    """Table rows (not a header, not the `|---` line under it) naming neither a commit hash nor
    "commit not recorded"."""
    lines = text.splitlines()
    missing = []
    for number, line in enumerate(lines, start=1):
        if not line.startswith("|") or SEPARATOR.match(line):
            continue
        is_header = number < len(lines) and SEPARATOR.match(lines[number]) is not None
        if is_header or COMMIT.search(line) or NOT_RECORDED in line:
            continue
        missing.append(f"  line {number}: {line}")
    return missing


def sections_without_script(text: str, root: Path) -> list[str]:
    """`## ` headings that name no `bench/<file>.py`, or name one that does not exist."""
    wrong = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.startswith("## "):
            continue
        names = SCRIPT.findall(line)
        if not names or any(not (root / "bench" / f"{name}.py").is_file() for name in names):
            wrong.append(f"  line {number}: {line}")
    return wrong


def test_results_md_is_under_500_lines() -> None:
    num_lines = len(RESULTS.read_text(encoding="utf-8").splitlines())
    assert num_lines < MAX_LINES, (
        f"bench/RESULTS.md has {num_lines} lines: keep the latest row per machine and move the "
        "rest to bench/history/ (git keeps it too)"
    )


def test_every_table_row_names_its_commit() -> None:
    missing = rows_without_commit(RESULTS.read_text(encoding="utf-8"))
    assert not missing, (
        f"bench/RESULTS.md rows without a commit hash or '{NOT_RECORDED}':\n" + "\n".join(missing)
    )


def test_every_section_names_a_script_that_exists() -> None:
    wrong = sections_without_script(RESULTS.read_text(encoding="utf-8"), ROOT)
    assert not wrong, (
        "bench/RESULTS.md sections that name no existing bench/<file>.py:\n" + "\n".join(wrong)
    )


def test_the_checks_catch_a_row_without_a_commit_and_a_section_without_a_script() -> None:
    text = "\n".join(
        [
            "## Engine throughput (`bench/engine_throughput.py`)",
            "| machine | commit | tok/s |",
            "|---|---|---:|",
            "| Zen 4 | 170cac2 | 734.3 |",
            "| Zen 5 | commit not recorded | 1378.9 |",
            "| AMX Xeon | HEAD | 1203.0 |",
            "## Notes",
            "## Gone (`bench/no_such_script.py`)",
        ]
    )
    assert rows_without_commit(text) == ["  line 6: | AMX Xeon | HEAD | 1203.0 |"]
    assert sections_without_script(text, ROOT) == [
        "  line 7: ## Notes",
        "  line 8: ## Gone (`bench/no_such_script.py`)",
    ]
