"""bench/ledger_write.py --quick end to end (slow): both write paths on a real PostgreSQL, the
JSON's shape, every figure positive and finite; no thresholds (the figures are in RESULTS.md)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "ledger_write.py"


@pytest.mark.slow
def test_quick_run_writes_the_json(postgres_server_url: str, tmp_path: Path) -> None:
    out = tmp_path / "ledger.json"
    subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--database-url", postgres_server_url,
         "--json", str(out)],
        check=True, timeout=300,
    )  # fmt: skip
    report = json.loads(out.read_text())
    assert set(report["cells"]) == {"copy_16", "copy_500", "insert_16", "insert_500"}
    for cell in report["cells"].values():
        for value in cell.values():
            assert math.isfinite(value) and value > 0
    assert set(report["ratios"]) == {"insert_over_copy_16", "insert_over_copy_500"}
