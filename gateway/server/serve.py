"""`loragate serve`: the gateway under uvicorn, configured from the environment (LORAGATE_*)."""

from __future__ import annotations

import argparse
import asyncio
import functools
import ipaddress
import math
import sys
from types import FrameType
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
    return create_app(settings, handle_signals=True, tune_gc=True)


def uvicorn_options(settings: GatewaySettings, *, log_level: str) -> dict[str, Any]:
    """How uvicorn runs the gateway, single process or workers alike."""
    from gateway.server.guard import ConnectionLimits
    from gateway.server.logs import log_config
    from gateway.server.protocol import GuardedH11Protocol, GuardedHttpToolsProtocol

    limits = ConnectionLimits(
        header_timeout_s=settings.header_timeout_s,
        body_timeout_s=settings.body_timeout_s,
        max_per_client=settings.max_connections_per_client,
        max_header_bytes=settings.max_header_bytes,
    )
    protocol = (
        GuardedHttpToolsProtocol if settings.http_parser == "httptools" else GuardedH11Protocol
    )
    return {
        "http": functools.partial(protocol, limits=limits),
        "loop": settings.event_loop,
        "log_config": log_config(log_level, key_prefix=settings.key_prefix),
        "log_level": log_level,
        "timeout_keep_alive": settings.keepalive_timeout_s,
        # h11's own bound on a head (16 KiB by default, answered 400) above the guard's, which
        # answers 431 alike for both parsers: one read past it (asyncio and uvloop read at most
        # 256 KiB at a time).
        "h11_max_incomplete_event_size": settings.max_header_bytes + 256 * 1024,
        "timeout_graceful_shutdown": math.ceil(settings.shutdown_grace_s) + UVICORN_MARGIN_S,
        # X-Forwarded-For and -Proto only from the proxies named (uvicorn's default trusts
        # any loopback peer, so a local client could choose its own recorded address).
        "proxy_headers": bool(settings.forwarded_allow_ips),
        "forwarded_allow_ips": ",".join(settings.forwarded_allow_ips) or "",
    }


def run_server(settings: GatewaySettings, *, host: str, port: int, log_level: str) -> None:
    import uvicorn

    from gateway.app import create_app, drain_then_threadsafe

    if settings.engine_mode != "inprocess":
        uvicorn.run(
            create_app(settings, handle_signals=True, tune_gc=True),
            host=host,
            port=port,
            **uvicorn_options(settings, log_level=log_level),
        )
        return
    from gateway.engines.inprocess import MainThreadEngine

    # The embedded engine steps on this (the main) thread, uvicorn serves from another; the
    # model loads before the server listens.
    embedded = MainThreadEngine(settings)
    app = create_app(settings, engine_client=embedded.client, tune_gc=True)
    server = uvicorn.Server(
        uvicorn.Config(app, host=host, port=port, **uvicorn_options(settings, log_level=log_level))
    )

    def on_signal(sig: int, frame: FrameType | None) -> None:
        # As drain_on_signals does on the main thread: the lifecycle's drain first (every
        # stream gets the grace period and a clean end, new requests a 503 while the socket
        # still listens), then uvicorn's own shutdown.
        drain_then_threadsafe(app, lambda: server.handle_exit(sig, frame))

    embedded.serve(server, on_signal)


def metrics_guarded(settings: GatewaySettings, host: str) -> bool:
    """/metrics names tenants and models: beyond loopback it needs a token, or no start."""
    if settings.metrics_token is not None or _is_loopback(host):
        return True
    print(
        f"loragate serve: --host {host} would expose /metrics to the network; "
        "set LORAGATE_METRICS_TOKEN (Prometheus sends it as a bearer token)",
        file=sys.stderr,
    )
    return False


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name: assume it is reachable


def schema_ready(settings: GatewaySettings) -> bool:
    """Unless the gateway migrates at start, the schema must already be this code's: say so
    in one line rather than serving 503 to every request."""
    if settings.auto_migrate:
        return True
    from tenancy.sql.migrate import SchemaOutOfDate, check_schema
    from tenancy.sql.session import make_engine

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


def workers_refusal(settings: GatewaySettings, workers: int) -> str | None:
    """Why `workers` processes cannot serve these settings (None: they can)."""
    if workers <= 1:
        return None
    if settings.engine_mode == "inprocess":
        return "--workers > 1 needs LORAGATE_ENGINE_MODE=http (each worker would load the model)"
    if settings.quota_store == "inprocess":
        return (
            "--workers > 1 needs LORAGATE_QUOTA_STORE=redis (an in-process store would count "
            "every limit per worker, letting a tenant through N times)"
        )
    return None


def _serve(args: argparse.Namespace) -> int:
    settings = load_settings()
    if settings is None or not metrics_guarded(settings, args.host):
        return 2
    refusal = workers_refusal(settings, args.workers)
    if refusal is not None:
        print(f"loragate serve: {refusal}", file=sys.stderr)
        return 2
    if not schema_ready(settings):
        return 2
    if args.workers > 1:
        import uvicorn

        uvicorn.run(
            "gateway.server.serve:app_from_environment",
            factory=True,
            host=args.host,
            port=args.port,
            workers=args.workers,
            **uvicorn_options(settings, log_level=args.log_level),
        )
        return 0
    run_server(settings, host=args.host, port=args.port, log_level=args.log_level)
    return 0
