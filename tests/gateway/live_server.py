"""The gateway app under a real uvicorn on a free loopback port, inside the test's event loop
(so a test can look at the app's state: the engine, the quota store, the ledger)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import uvicorn
from fastapi import FastAPI

from gateway.app import create_app
from gateway.settings import GatewaySettings
from gateway.state import GatewayState


@asynccontextmanager
async def live_gateway(settings: GatewaySettings) -> AsyncIterator[tuple[str, GatewayState]]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)
    port = sock.getsockname()[1]
    app: FastAPI = create_app(settings)
    server = uvicorn.Server(
        uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=30, backlog=1024)
    )
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}", app.state.gateway
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 120)
        sock.close()
