"""`loragate serve`: the gateway under uvicorn, configured from the environment (LORAGATE_*)."""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
from typing import Any

from pydantic import ValidationError

from gateway.settings import GatewaySettings

# uvicorn's own limit, past the gateway's drain (which ends every stream at the grace period):
# only a stuck connection is ever cut by uvicorn.
UVICORN_MARGIN_S = 5


def add_subcommands(subparsers: Any) -> None:
    serve = subparsers.add_parser(
        "serve", help="serve the OpenAI-compatible gateway (settings from LORAGATE_* variables)"
    )
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--workers", type=int, default=1, help="processes (HTTP engine mode only)")
    serve.add_argument("--log-level", default="info")
    serve.set_defaults(handler=_serve)


def load_settings(**overrides: Any) -> GatewaySettings | None:
    """Settings from the environment; on a bad value, name the fields (never their values)."""
    try:
        return GatewaySettings(**overrides)
    except ValidationError as exc:
        names = ", ".join(".".join(str(p) for p in e["loc"]) or e["msg"] for e in exc.errors())
        print(f"invalid settings (LORAGATE_*): {names}", file=sys.stderr)
        return None


def app_from_environment() -> Any:
    """The uvicorn factory for `--workers N`: each worker reads the same environment."""
    from gateway.app import create_app

    settings = load_settings()
    if settings is None:
        raise SystemExit(2)
    return create_app(settings, handle_signals=True)


def run_server(settings: GatewaySettings, *, host: str, port: int, log_level: str) -> None:
    import uvicorn

    from gateway.app import create_app

    uvicorn.run(
        create_app(settings, handle_signals=True),
        host=host,
        port=port,
        log_level=log_level,
        timeout_graceful_shutdown=math.ceil(settings.shutdown_grace_s) + UVICORN_MARGIN_S,
    )


def schema_ready(settings: GatewaySettings) -> bool:
    """Unless the gateway migrates at start, the schema must already be this code's: say so
    in one line rather than serving 503 to every request."""
    if settings.auto_migrate:
        return True
    from tenancy.db import make_engine
    from tenancy.migrate import SchemaOutOfDate, check_schema

    async def check() -> None:
        engine = make_engine(settings.database_url)
        try:
            await check_schema(engine)
        finally:
            await engine.dispose()

    try:
        asyncio.run(check())
    except SchemaOutOfDate as exc:
        print(f"loragate serve: {exc}", file=sys.stderr)
        return False
    return True


def _serve(args: argparse.Namespace) -> int:
    settings = load_settings()
    if settings is None or not schema_ready(settings):
        return 2
    if args.workers > 1:
        if settings.engine_mode == "inprocess":
            print("--workers > 1 needs LORAGATE_ENGINE_MODE=http", file=sys.stderr)
            return 2
        import uvicorn

        uvicorn.run(
            "gateway.serve:app_from_environment",
            factory=True,
            host=args.host,
            port=args.port,
            workers=args.workers,
            log_level=args.log_level,
            timeout_graceful_shutdown=math.ceil(settings.shutdown_grace_s) + UVICORN_MARGIN_S,
        )
        return 0
    run_server(settings, host=args.host, port=args.port, log_level=args.log_level)
    return 0
