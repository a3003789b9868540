"""The `loragate` console script: one entry point, subcommands registered by each package.

Only the command being run is built: its package's `add_subcommands` is imported and called,
and every other command is a one-line stub that `loragate --help` lists. So `loragate admin ...`
never imports the engine's option schema (nor torch, the web stack or SQL, which the handlers
import when they run): a shell command answers at once (tests/tenancy/admin_cli/
test_light_imports.py checks which modules each command imports).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType


def _engine_cli() -> ModuleType:
    from engine import cli

    return cli


def _tenancy_cli() -> ModuleType:
    from tenancy import cli

    return cli


def _serve_cli() -> ModuleType:
    from gateway.server import serve

    return serve


def _demo_cli() -> ModuleType:
    from gateway.demo import command

    return command


@dataclass(frozen=True)
class Registrar:
    load: Callable[[], ModuleType]  # the module whose add_subcommands(subparsers) adds `commands`
    commands: dict[str, str]  # name -> the help line its stub shows (the same as the module's)


REGISTRARS = (
    Registrar(_engine_cli, {
        "make-model": "write a deterministic tiny/small Hugging Face checkpoint directory",
        "make-adapter": "write a PEFT LoRA adapter with seeded random weights for a "
        "checkpoint's shapes",
        "engine": "serve the tokens-only engine over HTTP",
    }),
    Registrar(_tenancy_cli, {"admin": "tenancy administration"}),
    Registrar(_serve_cli, {
        "serve": "serve the OpenAI-compatible gateway (settings from LORAGATE_* variables)",
    }),
    Registrar(_demo_cli, {
        "demo": "the embedded demo: a demo tenant and key, then the gateway on this machine",
    }),
)  # fmt: skip


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole tree; given `command` (the first word of a command line), only the package that
    owns it is imported and built, and the other commands are stubs."""
    parser = argparse.ArgumentParser(prog="loragate", description=__doc__.split("\n\n")[0])
    subparsers = parser.add_subparsers(dest="command", required=True)
    for registrar in REGISTRARS:
        if command is None or command in registrar.commands:
            registrar.load().add_subcommands(subparsers)
            continue
        for name, help in registrar.commands.items():
            subparsers.add_parser(name, help=help, description=help)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    command = words[0] if words and not words[0].startswith("-") else ""
    args = build_parser(command).parse_args(words)
    result: int = args.handler(args)
    return result


if __name__ == "__main__":
    raise SystemExit(main())
