"""`loragate --help`, `loragate admin --help` and the admin REST commands import only what they
need: never torch, transformers, the web stack, SQL, triton or the engine (gateway/cli.py builds
only the command being run; the handlers import the rest when they run). Checked by the modules a
fresh interpreter holds afterwards, not by a clock."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import pytest

from gateway.cli import REGISTRARS, build_parser

HEAVY = ("torch", "transformers", "fastapi", "starlette", "sqlalchemy", "alembic", "triton",
         "uvicorn", "numpy", "engine", "lora", "gateway.app", "gateway.settings")  # fmt: skip

PROBE = """
import json, sys
from gateway.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print(json.dumps(sorted(sys.modules)))
"""


def _modules_after(*argv: str) -> set[str]:
    env = {**os.environ, "LORAGATE_ADMIN_URL": "http://127.0.0.1:9", "LORAGATE_ADMIN_KEY": "x"}
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *argv], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize(
    "argv",
    [
        ("--help",),
        ("admin", "--help"),
        ("admin", "adapters", "upload", "--help"),
        ("admin", "tenants", "list"),  # runs: httpx, then `cannot reach` (port 9)
        ("admin", "keys", "list", "acme"),  # a name: resolved over the API
        ("admin", "adapters", "list", "acme", "--json"),
    ],
)
def test_admin_commands_stay_light(argv: tuple[str, ...]) -> None:
    modules = _modules_after(*argv)
    heavy = sorted(m for m in modules if m.split(".")[0] in HEAVY or m in HEAVY)
    assert not heavy, f"loragate {' '.join(argv)} imported {heavy[:12]}"


def test_a_list_command_did_run() -> None:
    """The probe above sees a command that ran (the client was imported), not one that
    stopped at argument parsing."""
    assert "tenancy.admin_cli.client" in _modules_after("admin", "tenants", "list")


def test_the_stubs_show_each_command_help() -> None:
    """`loragate --help` lists the stubs' help lines: the same as each package's own parser."""
    helps, stub_helps = _help_lines(build_parser()), _help_lines(build_parser(""))
    assert helps == stub_helps
    assert set(helps) == {name for r in REGISTRARS for name in r.commands}


def _help_lines(parser: argparse.ArgumentParser) -> dict[str, str | None]:
    found = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return {a.dest: a.help for a in found[0]._choices_actions}
