"""The `loragate` console script: one entry point, subcommands registered by each package."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from engine import cli as engine_cli
from gateway.demo import command as gateway_demo
from gateway.server import serve as gateway_serve
from tenancy import cli as tenancy_cli


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="loragate", description=__doc__)
    subparsers = parser.add_subparsers(dest="command", required=True)
    engine_cli.add_subcommands(subparsers)
    tenancy_cli.add_subcommands(subparsers)
    gateway_serve.add_subcommands(subparsers)
    gateway_demo.add_subcommands(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    result: int = args.handler(args)
    return result


if __name__ == "__main__":
    raise SystemExit(main())
