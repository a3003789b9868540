"""Packaging: the project's metadata builds without setuptools deprecation warnings (the license
is an SPDX expression, not a table)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_metadata_builds_without_deprecation_warnings() -> None:
    code = (
        "import warnings\n"
        "warnings.simplefilter('error')\n"
        "from setuptools.config.pyprojecttoml import read_configuration\n"
        "config = read_configuration('pyproject.toml')\n"
        "print(config['project']['license'])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "Apache-2.0"
