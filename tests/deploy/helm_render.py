"""`helm template` for the tests: the `helm` binary when one is on PATH, otherwise Helm's own Go
SDK (v4) through helm-python-sdk's bundled libhelm_c (a dev dependency, installed by `make
install`), which renders with the same engine. Neither: the caller skips and says why."""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import yaml

CHART = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "loragate"
RELEASE = "lg"


def renderer() -> str | None:
    """How charts are rendered here ("helm binary", "helm SDK"), or None."""
    if shutil.which("helm"):
        return "helm binary"
    try:
        import helm_python  # noqa: F401
    except (ImportError, OSError):
        return None
    return "helm SDK"


def render(values: dict[str, Any]) -> list[dict[str, Any]]:
    """Every manifest of the chart for `values` (merged over values.yaml), in file order."""
    if shutil.which("helm"):
        with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
            json.dump(values, f)
            f.flush()
            text = subprocess.run(
                ["helm", "template", RELEASE, str(CHART), "-f", f.name],
                capture_output=True, text=True, check=True, timeout=60,
            ).stdout  # fmt: skip
    else:
        import helm_python as helm

        with helm.Chart.load(str(CHART)) as chart:
            rendered = chart.render(values, name=RELEASE, namespace="default", is_install=True)
        text = "\n---\n".join(rendered[name] for name in sorted(rendered))
    return [doc for doc in yaml.safe_load_all(text) if doc]
