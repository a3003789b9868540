"""`loragate admin ...` run in this process through the console script's `main` (fast), with its
exit code, stdout and stderr; and a PEFT adapter directory for the served tiny model."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from gateway_process import GatewayProcess

from gateway.cli import main
from gateway.demo.adapters import demo_adapter_files
from tenancy.adapters.base_model import base_model_spec

MODEL = "tiny"


class Cli:
    def __init__(self, gateway: GatewayProcess, capsys: pytest.CaptureFixture[str]) -> None:
        self.gateway = gateway
        self.capsys = capsys

    def run(self, *argv: str, stdin: str | None = None) -> tuple[int, str, str]:
        self.capsys.readouterr()
        old = sys.stdin
        if stdin is not None:
            sys.stdin = io.StringIO(stdin)
        try:
            code = main(["admin", *argv])
        except SystemExit as exc:  # argparse refuses bad arguments by exiting
            code = int(exc.code or 0)
        finally:
            sys.stdin = old
        out, err = self.capsys.readouterr()
        return code, out, err

    def json(self, *argv: str) -> Any:
        code, out, err = self.run(*argv, "--json")
        assert code == 0, err
        return json.loads(out)


def adapter_dir(tiny_model_dir: Path, target: Path, **config: Any) -> Path:
    """A PEFT directory (seeded weights) for the tiny model; `config` overrides
    adapter_config.json's fields."""
    target.mkdir(parents=True)
    for f in demo_adapter_files(base_model_spec(tiny_model_dir, MODEL), seed=5):
        data = f.data
        if f.filename == "adapter_config.json" and config:
            data = json.dumps({**json.loads(data), **config}).encode()
        (target / f.filename).write_bytes(data)
    return target
